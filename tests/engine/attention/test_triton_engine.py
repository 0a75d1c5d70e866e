"""The engine end to end on the triton backend (triton's interpreter without a GPU): greedy tokens
equal Hugging Face's and the torch backend's, with chunked prefill and with preemption."""

import pytest
import torch
from hf_reference import hf_greedy

from engine import LLM, SamplingParams

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PROMPTS = [[5, 6, 7, 8, 9], list(range(10, 47)), [3] * 17]
MAX_TOKENS = [12, 6, 9]


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def reference(tiny_hf):
    return hf_greedy(tiny_hf, PROMPTS, MAX_TOKENS)


@pytest.mark.parametrize(
    "blocks, budget, mode", [(None, 2048, "recompute"), (None, 8, "recompute"), (12, 64, "swap")]
)
def test_triton_backend_matches_hf_and_torch(tiny_model_dir, reference, blocks, budget, mode):
    kw = dict(
        dtype="float32",
        device=DEVICE,
        block_size=4,
        num_kv_blocks=blocks,
        kv_cache_gib=0.01,
        max_num_batched_tokens=budget,
        preemption_mode=mode,
        num_swap_blocks=32,
    )
    llm = LLM(model=str(tiny_model_dir), attention_backend="triton", **kw)
    out = [c.token_ids for c in llm.generate(PROMPTS, [greedy(n) for n in MAX_TOKENS])]
    assert out == reference
    if blocks:  # 48 slots for three sequences of up to 43 tokens: must preempt (by swapping)
        assert llm.engine.stats.preemptions > 0 and llm.engine.stats.swaps > 0
    assert llm.engine.num_free_blocks == llm.engine.num_total_blocks
    torch_out = LLM(model=str(tiny_model_dir), attention_backend="torch", **kw).generate(
        PROMPTS, [greedy(n) for n in MAX_TOKENS]
    )
    assert [c.token_ids for c in torch_out] == out
