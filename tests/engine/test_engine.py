"""Engine behaviour on a tiny random-weight Llama with GQA, against Hugging Face `generate`."""

import random

import pytest
from hf_reference import hf_greedy
from paths import FP32_C, FP32_TORCH, params
from workload import greedy, random_workload

from engine import (
    LLM,
    ContextLengthExceededError,
    DuplicateRequestError,
    Engine,
    InvalidRequestError,
    SamplingParams,
)

PROMPTS = [[5, 6, 7, 8, 9], list(range(10, 47)), [3] * 17, [50, 51], list(range(60, 90))]
MAX_TOKENS = [20, 9, 33, 12, 25]


@pytest.fixture(scope="module")
def reference(tiny_hf):
    return hf_greedy(tiny_hf, PROMPTS, MAX_TOKENS)


@pytest.mark.parametrize("path", params([FP32_TORCH, FP32_C]))
@pytest.mark.parametrize("blocks, budget", [(None, 2048), (None, 8), (16, 64)])
def test_greedy_matches_hf_generate(tiny_model_dir, reference, path, blocks, budget):
    llm = path.llm(
        str(tiny_model_dir),
        block_size=4,
        num_kv_blocks=blocks,
        kv_cache_gib=0.01,
        max_num_batched_tokens=budget,
        preemption_mode="recompute",
    )  # swap: test_swap.py
    out = llm.generate(PROMPTS, [greedy(n) for n in MAX_TOKENS])
    assert [c.token_ids for c in out] == reference
    assert all(c.finish_reason == "length" for c in out)
    stats = llm.engine.stats
    if blocks == 16:  # 80 slots for five sequences of up to 63 tokens: must preempt and recompute
        assert stats.preemptions > 0
    assert llm.engine.num_free_blocks == llm.engine.num_total_blocks


def test_preemption_with_bfloat16_finishes_and_frees(tiny_model_dir):
    llm = LLM(model=str(tiny_model_dir), dtype="bfloat16", block_size=4, num_kv_blocks=16)
    out = llm.generate(PROMPTS, [greedy(n) for n in MAX_TOKENS])
    assert [len(c.token_ids) for c in out] == MAX_TOKENS
    assert llm.engine.stats.preemptions > 0
    assert llm.engine.num_free_blocks == 16


def test_aborts_mid_prefill_and_mid_decode_free_every_block(tiny_model_dir):
    eng = Engine(
        model=str(tiny_model_dir), dtype="float32", block_size=4, kv_cache_gib=0.01, max_num_batched_tokens=16
    )
    total = eng.num_free_blocks
    eng.add_request("long", list(range(2, 60)), greedy(30))  # 58 tokens: 4 chunks of 16
    eng.add_request("short", [4, 5, 6], greedy(30))
    eng.step()
    assert 0 < eng.seqs["long"].num_computed_tokens < 58  # mid-prefill
    assert eng.abort("long")
    for _ in range(3):
        eng.step()
    assert eng.seqs["short"].num_output_tokens >= 2  # mid-decode
    assert eng.abort("short")
    eng.add_request("queued", [7, 8], greedy(5))  # aborted while still waiting
    assert eng.abort("queued")
    assert not eng.abort("queued") and not eng.has_unfinished()
    assert eng.num_free_blocks == total


def test_shared_prefix_is_computed_once(tiny_model_dir, tiny_hf):
    system = list(range(100, 164))  # 64 tokens = 16 full blocks
    prompts = [system + [1 + i, 2 + i, 3 + i] for i in range(4)]
    eng = Engine(model=str(tiny_model_dir), dtype="float32", block_size=4, kv_cache_gib=0.01)
    eng.add_request("first", prompts[0], greedy(4))
    while eng.has_unfinished():
        eng.step()
    before = eng.stats.prefill_tokens
    assert before == len(prompts[0])
    outs = {}
    for i, p in enumerate(prompts[1:]):
        eng.add_request(str(i), p, greedy(4))
    while eng.has_unfinished():
        for o in eng.step():
            outs.setdefault(o.request_id, []).extend(o.new_token_ids)
    # Only the 3 distinct tail tokens of each later prompt ran through the model.
    assert eng.stats.prefill_tokens - before == 3 * 3
    assert eng.block_manager.num_prefix_hit_tokens == 3 * 64
    assert [outs[str(i)] for i in range(3)] == hf_greedy(tiny_hf, prompts[1:], [4, 4, 4])


def test_stop_token_ids_and_eos(tiny_model_dir, reference):
    llm = LLM(model=str(tiny_model_dir), dtype="float32")
    stop_at = reference[0][5]
    out = llm.generate(PROMPTS[0], SamplingParams(max_tokens=20, temperature=0, stop_token_ids=[stop_at]))[0]
    assert out.finish_reason == "stop"
    assert out.token_ids == reference[0][: reference[0].index(stop_at) + 1]


def test_seeded_sampling_is_reproducible_and_batch_independent(tiny_model_dir):
    llm = LLM(model=str(tiny_model_dir), dtype="float32")
    p = SamplingParams(max_tokens=15, temperature=1.0, top_p=0.9, top_k=50, seed=42, ignore_eos=True)
    alone = llm.generate(PROMPTS[1], p)[0].token_ids
    batch = llm.generate(
        PROMPTS, [p if i == 1 else SamplingParams(max_tokens=8, temperature=0.7) for i in range(5)]
    )
    assert batch[1].token_ids == alone
    other = llm.generate(PROMPTS[1], SamplingParams(max_tokens=15, temperature=1.0, seed=7, ignore_eos=True))[
        0
    ]
    assert other.token_ids != alone


def test_resume_continues_after_given_tokens(tiny_model_dir, reference):
    eng = Engine(model=str(tiny_model_dir), dtype="float32")
    done = reference[0][:6]
    eng.add_request("r", PROMPTS[0], greedy(20), resume_token_ids=done)
    tokens, last = [], None
    while eng.has_unfinished():
        for o in eng.step():
            tokens += o.new_token_ids
            last = o
    assert done + tokens == reference[0]
    assert last.num_output_tokens == 20 and last.finish_reason == "length"


@pytest.mark.parametrize(
    "prompt, params, error, param",
    [
        ([], greedy(4), InvalidRequestError, "prompt"),
        ([7] * 600, greedy(100), ContextLengthExceededError, "prompt"),
        ([1, 2, 3], greedy(600), ContextLengthExceededError, "max_tokens"),
        ([1, 2, 999], greedy(4), InvalidRequestError, "prompt"),
        (["a"], greedy(4), InvalidRequestError, "prompt"),
        ([1, 2], SamplingParams(max_tokens=3, stop_token_ids=[256]), InvalidRequestError, "stop_token_ids"),
        ([1, 2], SamplingParams(max_tokens=3, stop=["x"]), InvalidRequestError, "stop"),
    ],
)
def test_bad_input_is_refused_before_scheduling(tiny_model_dir, prompt, params, error, param):
    eng = Engine(model=str(tiny_model_dir), dtype="float32", kv_cache_gib=0.01)
    with pytest.raises(error) as err:
        eng.add_request("x", prompt, params)
    assert err.value.param == param and err.value.message
    assert not eng.has_unfinished() and eng.num_free_blocks == eng.num_total_blocks


def test_duplicate_request_id_and_bad_batch_schedule_nothing(tiny_model_dir):
    eng = Engine(model=str(tiny_model_dir), dtype="float32", kv_cache_gib=0.01)
    eng.add_request("x", [1, 2], greedy(2))
    with pytest.raises(DuplicateRequestError):
        eng.add_request("x", [1, 2], greedy(2))
    llm = LLM(model=str(tiny_model_dir), dtype="float32", kv_cache_gib=0.01)
    with pytest.raises(InvalidRequestError):  # the third prompt is bad: none of them may start
        llm.generate([[1, 2], [3, 4], []], greedy(3))
    assert not llm.engine.has_unfinished()


def test_random_workload_keeps_block_accounting_exact(tiny_model_dir):
    rng = random.Random(3)
    eng = Engine(
        model=str(tiny_model_dir),
        dtype="float32",
        block_size=4,
        num_kv_blocks=24,
        max_num_batched_tokens=24,
        max_num_seqs=6,
    )
    for _ in random_workload(eng, rng, 150):
        used = {b for s in eng.scheduler.running for b in s.block_table}
        assert eng.block_manager.num_used_blocks == len(used)
    for rid in list(eng.seqs):
        eng.abort(rid)
    assert eng.num_free_blocks == 24 and eng.stats.preemptions > 0


def test_has_room_admits_a_batch_up_to_the_sequence_cap_and_the_blocks(tiny_model_dir):
    eng = Engine(model=str(tiny_model_dir), dtype="float32", block_size=4, num_kv_blocks=40, max_num_seqs=4)
    added = 0
    while eng.has_room():  # several requests may wait at once, as a worker pulls a batch
        eng.add_request(str(added), [5, 6, 7, 8, 9, 10, 11], greedy(3))
        added += 1
    assert added == 4 and eng.num_waiting == 4
    eng.step()
    assert eng.num_running == 4 and not eng.has_room()
    small = Engine(model=str(tiny_model_dir), dtype="float32", block_size=4, num_kv_blocks=8, max_num_seqs=8)
    n = 0
    while small.has_room():  # 12-token prompts need 4 blocks each (with the first output slot): two fit
        small.add_request(str(n), list(range(2, 14)), greedy(2))
        n += 1
    assert n == 2
