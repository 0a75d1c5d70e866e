"""A model whose every layer slides (a tiny Mistral, window 8) holds at most ceil(window / block)
+ 1 KV blocks per decoding sequence, and stays token-equal to transformers with prefix caching and
preemptions (by swap and by recompute) in the middle."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, MistralConfig

from engine import Engine, SamplingParams
from engine.block_manager import OUT_OF_WINDOW
from tests.engine.hf_reference import hf_greedy
from tests.engine.models.families import BASE

WINDOW, BLOCK = 8, 4
SHARED = [(7 * i + 3) % 250 + 2 for i in range(12)]  # a prefix every prompt starts with
PROMPTS = [SHARED + [(11 * i + j) % 250 + 2 for i in range(6 + 3 * j)] for j in range(4)]
MAX_TOKENS = [40, 30, 36, 28]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("mistral-window")
    AutoModelForCausalLM.from_config(
        MistralConfig(**BASE, sliding_window=WINDOW, head_dim=16)
    ).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def reference(model_dir):
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    return hf_greedy(hf.eval(), PROMPTS, MAX_TOKENS)


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_window_bounds_blocks_and_tokens_equal_transformers(model_dir, reference, mode):
    eng = Engine(
        model=str(model_dir),
        dtype="float32",
        block_size=BLOCK,
        num_kv_blocks=10,  # four prompts of 18-27 tokens need 22 blocks at once: preemptions
        max_num_batched_tokens=16,
        preemption_mode=mode,
        num_threads=2,
    )
    assert eng.block_manager.sliding_window == WINDOW
    bound = -(-WINDOW // BLOCK) + 1
    out: dict[str, list[int]] = {}
    for i, (p, n) in enumerate(zip(PROMPTS, MAX_TOKENS)):
        eng.add_request(str(i), p, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True))
    released = held_max = 0
    while eng.has_unfinished():
        for o in eng.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
        for seq in eng.scheduler.running:
            if seq.num_computed_tokens >= seq.num_prompt_tokens:  # decoding
                held = eng.block_manager.num_held_blocks(seq)
                assert held <= bound, (seq.request_id, held, seq.num_computed_tokens)
                held_max = max(held_max, held)
                released = max(released, seq.block_table.count(OUT_OF_WINDOW))
    assert [out[str(i)] for i in range(len(PROMPTS))] == reference
    assert eng.stats.preemptions > 0 and released > 5 and held_max == bound
    eng.step()
    bm = eng.block_manager
    assert bm.num_free_blocks == bm.num_blocks and bm.num_free_host_blocks == bm.num_host_blocks
