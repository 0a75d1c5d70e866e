"""Models that mix sliding and full layers (tiny Gemma 2 and Gemma 3, window 8): the sliding layers'
KV blocks live in a pool of their own, released out of the window, so a decoding sequence holds at
most ceil(window / block) + 1 of them while its full-layer blocks grow with it; tokens stay equal
to transformers' and to the one-pool engine's, through prefix caching and preemptions by swap and
by recompute (on the CPU C kernel and on the torch reference); every block of both pools comes back
after finish, abort and preemption."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, Gemma2Config

from engine import Engine, SamplingParams
from engine.block_manager import OUT_OF_WINDOW
from engine.kv_groups import HybridBlockManager, sliding_pool_blocks, split_budget, split_pairs
from tests.engine.hf_reference import hf_greedy
from tests.engine.models.families import BASE, WINDOW, load_hf, save_family

BLOCK = 4
BOUND = -(-WINDOW // BLOCK) + 1  # sliding blocks a decoding sequence holds at most
SHARED = [(7 * i + 3) % 250 + 2 for i in range(12)]  # a prefix every prompt starts with
PROMPTS = [SHARED + [(11 * i + j) % 250 + 2 for i in range(6 + 3 * j)] for j in range(4)]
MAX_TOKENS = [80, 70, 60, 90]  # 10 windows and more; at most 117 tokens (max_position_embeddings 128)
FAMILIES = ["gemma2", "gemma3"]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    folder = save_family(request.param, tmp_path_factory.mktemp(request.param))
    return folder, hf_greedy(load_hf(folder), PROMPTS, MAX_TOKENS)


def engine(folder, **overrides) -> Engine:
    args = dict(
        model=str(folder),
        dtype="float32",
        block_size=BLOCK,
        num_kv_blocks=40,  # a 117-token sequence needs 30 full-pool blocks: four at once preempt
        max_num_seqs=3,  # the sliding pool: 3 * (2 + 2) + 16 / 4 = 16 blocks
        max_num_batched_tokens=16,
        num_threads=2,
    )
    return Engine(**{**args, **overrides})


def run(eng: Engine, check=None) -> list[list[int]]:
    out: dict[str, list[int]] = {}
    for i, (p, n) in enumerate(zip(PROMPTS, MAX_TOKENS)):
        eng.add_request(str(i), p, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True))
    while eng.has_unfinished():
        for o in eng.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
        if check:
            check(eng)
    eng.step()  # the last finished sequences' blocks are freed
    return [out[str(i)] for i in range(len(PROMPTS))]


def all_back(bm: HybridBlockManager) -> bool:
    return all(
        m.num_free_blocks == m.num_blocks and m.num_free_host_blocks == m.num_host_blocks
        for m in (bm.full, bm.sliding)
    )


@pytest.mark.parametrize("mode,backend", [("swap", "cpu"), ("recompute", "torch")])
def test_sliding_blocks_stay_bounded_and_tokens_equal_transformers(family, mode, backend):
    folder, reference = family
    eng = engine(folder, preemption_mode=mode, attention_backend=backend)
    bm = eng.block_manager
    assert isinstance(bm, HybridBlockManager) and bm.sliding.num_blocks == 16 and bm.full.num_blocks == 40
    seen = {"held": 0, "released": 0, "full": 0}

    def check(eng: Engine) -> None:
        for seq in eng.scheduler.running:
            if seq.num_computed_tokens >= seq.num_prompt_tokens:  # decoding
                held = bm.sliding.num_held_blocks(seq)
                assert held <= BOUND, (seq.request_id, held, seq.num_computed_tokens)
                assert bm.full.num_held_blocks(seq) == -(-seq.num_computed_tokens // BLOCK)
                seen["held"] = max(seen["held"], held)
                seen["released"] = max(seen["released"], seq.sliding_block_table.count(OUT_OF_WINDOW))
                seen["full"] = max(seen["full"], bm.full.num_held_blocks(seq))

    assert run(eng, check) == reference
    assert eng.stats.preemptions > 0 and (eng.stats.swaps > 0) == (mode == "swap")
    assert seen["held"] == BOUND and seen["released"] > 20 and seen["full"] > 25
    assert eng.stats.prefix_hit_tokens > 0  # the shared prefix, found in both pools
    assert all_back(bm)


def test_one_pool_gives_the_same_tokens_and_holds_every_block(family):
    folder, reference = family
    eng = engine(folder, sliding_pool=False, num_kv_blocks=120, max_num_seqs=4)
    assert not isinstance(eng.block_manager, HybridBlockManager)
    peak = {"used": 0}

    def check(eng: Engine) -> None:
        peak["used"] = max(peak["used"], eng.block_manager.num_used_blocks)

    assert run(eng, check) == reference
    assert peak["used"] > 60  # every block of every running sequence, for all layers


def test_abort_and_a_later_prefix_hit_give_every_block_back(family):
    folder, reference = family
    eng = engine(folder, preemption_mode="swap")
    bm = eng.block_manager
    for i, p in enumerate(PROMPTS):
        eng.add_request(str(i), p, SamplingParams(max_tokens=MAX_TOKENS[i], temperature=0, ignore_eos=True))
    for _ in range(40):  # decoding past several windows, some preempted
        eng.step()
    assert bm.sliding.num_used_blocks > 0
    for i in range(len(PROMPTS)):
        eng.abort(str(i))
    eng.step()
    assert all_back(bm)
    # a prompt computed, then again: its prefix comes from the cache (full pool: every block;
    # sliding pool: the blocks in the window before the hit's end, released but still cached)
    assert generate(eng, "first", PROMPTS[3], 2) == reference[3][:2]
    hit_before = eng.stats.prefix_hit_tokens
    assert generate(eng, "again", PROMPTS[3], MAX_TOKENS[3]) == reference[3]
    assert eng.stats.prefix_hit_tokens - hit_before == 24  # six blocks: the last token is computed
    eng.step()
    assert all_back(bm)


def generate(eng: Engine, request_id: str, prompt: list[int], max_tokens: int) -> list[int]:
    eng.add_request(request_id, prompt, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))
    out = []
    while eng.has_unfinished():
        for o in eng.step():
            out += o.new_token_ids
    return out


def test_pool_sizes_split_the_budget_by_what_the_sliding_layers_can_use():
    assert sliding_pool_blocks(10**6, 16, 4096, 8, 2048) == 8 * (256 + 2) + 128
    assert sliding_pool_blocks(100, 16, 4096, 8, 2048) == 100  # never more than the full pool
    # 21 full and 21 sliding layers: an even split where the budget is short
    assert split_budget(42 * 100, 21, 21, 500) == (100, 100)
    full, sliding = split_budget(42 * 1000, 21, 21, 500)
    assert sliding == 500 and full == 1500 and full * 21 + sliding * 21 <= 42 * 1000
    # copies in the shared id space go back to their pools
    out = [(1, 0), (41, 2), (45, 3)]  # (device, host); 40 full device blocks, 2 full host blocks
    assert split_pairs(out, 40, 2, swap_in=False) == ([(1, 0)], [(1, 0), (5, 1)])
    assert split_pairs([(3, 44)], 40, 2, swap_in=True) == ([], [(1, 4)])


def test_a_2000_token_conversation_holds_a_window_of_sliding_blocks(tmp_path):
    """Gemma 2, window 32, 16-token blocks: a conversation decoded to 2,000 tokens beside a second
    one that shares its prefix (a prefix hit in both pools) and is swapped out on the way, because
    the full pool (130 blocks) cannot hold both; tokens equal transformers'."""
    torch.manual_seed(0)
    config = Gemma2Config(
        **{**BASE, "max_position_embeddings": 2048},
        head_dim=16,
        query_pre_attn_scalar=24,
        sliding_window=32,
        attn_logit_softcapping=1.5,
        final_logit_softcapping=3.0,
    )
    hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.2)
    hf.save_pretrained(tmp_path)
    prompts = [[(7 * i + 3) % 250 + 2 for i in range(64)]]
    prompts.append(prompts[0][:48] + [(5 * i + 1) % 250 + 2 for i in range(16)])
    max_tokens = [1936, 1200]  # both grow until the full pool cannot hold them: b is swapped out
    reference = hf_greedy(load_hf(tmp_path), prompts, max_tokens)
    eng = engine(tmp_path, block_size=16, num_kv_blocks=130, max_num_seqs=2, preemption_mode="swap")
    bm = eng.block_manager
    assert isinstance(bm, HybridBlockManager)
    out: dict[str, list[int]] = {"a": [], "b": []}
    eng.add_request("a", prompts[0], SamplingParams(max_tokens=max_tokens[0], temperature=0, ignore_eos=True))
    held = 0
    while eng.has_unfinished():
        for o in eng.step():
            out[o.request_id] += o.new_token_ids
        if eng.stats.steps == 1:  # after a's prompt is computed: b's prefix is in the cache
            params = SamplingParams(max_tokens=max_tokens[1], temperature=0, ignore_eos=True)
            eng.add_request("b", prompts[1], params)
        for seq in eng.scheduler.running:
            if seq.num_computed_tokens >= seq.num_prompt_tokens:
                held = max(held, bm.sliding.num_held_blocks(seq))
    assert [out["a"], out["b"]] == reference
    assert held == 3 and eng.stats.swaps > 0 and eng.stats.prefix_hit_tokens == 48
    eng.step()
    assert all_back(bm)
