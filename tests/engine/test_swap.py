"""Swap preemption on a tiny random-weight Llama, against Hugging Face `generate`."""

import random

import pytest
from hf_reference import hf_greedy
from paths import FP32_C, FP32_TORCH, params
from workload import greedy, random_workload

from engine import Engine

SYSTEM = list(range(120, 140))  # 5 full blocks of 4, shared by the last two prompts
PROMPTS = [
    [5, 6, 7, 8, 9],
    list(range(10, 47)),
    [3] * 17,
    [50, 51],
    list(range(60, 90)),
    SYSTEM + [1, 2, 3],
    SYSTEM + [4, 5],
]
MAX_TOKENS = [20, 9, 33, 12, 25, 15, 18]


@pytest.fixture(scope="module")
def reference(tiny_hf):
    return hf_greedy(tiny_hf, PROMPTS, MAX_TOKENS)


def record_preemptions(eng: Engine) -> list[tuple[bool, bool]]:
    """(swapped?, mid-prefill?) of every preemption, as the scheduler makes it."""
    seen, schedule = [], eng.scheduler.schedule

    def recording():
        plan = schedule()
        seen.extend(
            (eng.block_manager.is_swapped(s), s.num_computed_tokens < s.num_prompt_tokens)
            for s in plan.preempted
        )
        return plan

    eng.scheduler.schedule = recording
    return seen


def run(eng: Engine, prompts, budgets) -> list[list[int]]:
    out: dict[str, list[int]] = {}
    for i, (p, n) in enumerate(zip(prompts, budgets)):
        eng.add_request(str(i), p, greedy(n))
    while eng.has_unfinished():
        for o in eng.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
    return [out[str(i)] for i in range(len(prompts))]


def assert_all_free(eng: Engine) -> None:
    eng.step()  # nothing to run; the host blocks read by the last swap-ins return to the pool
    bm = eng.block_manager
    assert bm.num_free_blocks == bm.num_blocks and bm.num_free_host_blocks == bm.num_host_blocks


@pytest.mark.parametrize("path", params([FP32_TORCH, FP32_C]))
@pytest.mark.parametrize("mode, budget", [("swap", 8), ("swap", 64), ("auto", 16)])
def test_greedy_with_swap_preemptions_matches_hf_generate(tiny_model_dir, reference, path, mode, budget):
    # 64 KV slots for seven sequences of up to 50 tokens: preemptions, some in the middle of a
    # chunked prefill (budget 8), some of sequences sharing prefix blocks.
    eng = Engine(
        model=str(tiny_model_dir),
        **path.overrides(),
        block_size=4,
        num_kv_blocks=16,
        max_num_batched_tokens=budget,
        preemption_mode=mode,
    )
    seen = record_preemptions(eng)
    assert run(eng, PROMPTS, MAX_TOKENS) == reference
    assert len(seen) == eng.stats.preemptions > 0 and eng.stats.swaps == sum(swapped for swapped, _ in seen)
    if mode == "swap":  # "auto" may recompute: on this tiny model a few tokens cost next to nothing
        assert eng.stats.swaps == len(seen) and eng.stats.swapped_blocks > 0 and eng.stats.swap_seconds > 0
    if budget == 8:
        assert any(mid for _, mid in seen)
    assert_all_free(eng)


def test_a_full_swap_space_falls_back_to_recompute_and_output_is_unchanged(tiny_model_dir, reference):
    eng = Engine(
        model=str(tiny_model_dir),
        dtype="float32",
        block_size=4,
        num_kv_blocks=16,
        max_num_batched_tokens=16,
        preemption_mode="swap",
        num_swap_blocks=10,
    )
    seen = record_preemptions(eng)
    assert run(eng, PROMPTS, MAX_TOKENS) == reference
    assert 0 < eng.stats.swaps < eng.stats.preemptions == len(seen)
    assert_all_free(eng)


def test_aborting_swapped_out_sequences_frees_host_and_device_blocks(tiny_model_dir):
    eng = Engine(
        model=str(tiny_model_dir),
        dtype="float32",
        block_size=4,
        num_kv_blocks=16,
        max_num_batched_tokens=16,
        preemption_mode="swap",
    )
    bm = eng.block_manager
    for i, (p, n) in enumerate(zip(PROMPTS, MAX_TOKENS)):
        eng.add_request(str(i), p, greedy(n))
    aborted = 0
    while eng.has_unfinished() and aborted < 3:
        eng.step()
        for seq in [s for s in eng.seqs.values() if bm.is_swapped(s)]:
            held = len(bm.host_blocks(seq))
            free = bm.num_free_host_blocks
            assert eng.abort(seq.request_id)
            assert bm.num_free_host_blocks == free + held and not bm.is_swapped(seq)
            aborted += 1
    assert aborted >= 3
    for rid in list(eng.seqs):
        eng.abort(rid)
    assert not eng.has_unfinished()
    assert_all_free(eng)


def test_random_workload_with_swaps_keeps_block_accounting_exact(tiny_model_dir):
    rng = random.Random(5)
    eng = Engine(
        model=str(tiny_model_dir),
        dtype="float32",
        block_size=4,
        num_kv_blocks=24,
        max_num_batched_tokens=24,
        max_num_seqs=6,
        preemption_mode="swap",
        num_swap_blocks=6,
    )
    bm = eng.block_manager
    for _ in random_workload(eng, rng, 200):
        bm.begin_step()  # the step's copies are done: count its swapped-in host blocks as free
        used = {b for s in eng.scheduler.running for b in s.block_table}
        assert bm.num_used_blocks == len(used)
        swapped = [s for s in eng.seqs.values() if bm.is_swapped(s)]
        assert all(not s.block_table and s.num_computed_tokens > 0 for s in swapped)
        held = [h for s in swapped for h in bm.host_blocks(s)]
        assert len(held) == len(set(held)) == bm.num_host_blocks - bm.num_free_host_blocks
    for rid in list(eng.seqs):
        eng.abort(rid)
    assert 0 < eng.stats.swaps < eng.stats.preemptions  # host space ran out at times: recomputed
    assert_all_free(eng)
