"""The engine end to end on the triton backend (triton's interpreter without a GPU): greedy tokens
equal Hugging Face's and the torch backend's, with chunked prefill and with preemption, in fp32;
in bf16 the greedy tokens agree with the torch backend's in bf16 (tests/engine/paths.py)."""

import pytest
import torch
from hf_reference import hf_greedy
from paths import AGREE_BF16, BF16_TORCH, TRITON_BF16, TRITON_FP32, greedy_prefix, params

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
@pytest.mark.parametrize("path", params([TRITON_FP32]))
def test_triton_backend_matches_hf_and_torch(tiny_model_dir, reference, path, blocks, budget, mode):
    kw = dict(
        device=DEVICE,
        block_size=4,
        num_kv_blocks=blocks,
        kv_cache_gib=0.01,
        max_num_batched_tokens=budget,
        preemption_mode=mode,
        num_swap_blocks=32,
    )
    llm = path.llm(str(tiny_model_dir), **kw)
    out = [c.token_ids for c in llm.generate(PROMPTS, [greedy(n) for n in MAX_TOKENS])]
    assert out == reference
    if blocks:  # 48 slots for three sequences of up to 43 tokens: must preempt (by swapping)
        assert llm.engine.stats.preemptions > 0 and llm.engine.stats.swaps > 0
    assert llm.engine.num_free_blocks == llm.engine.num_total_blocks
    torch_out = LLM(model=str(tiny_model_dir), dtype="float32", attention_backend="torch", **kw).generate(
        PROMPTS, [greedy(n) for n in MAX_TOKENS]
    )
    assert [c.token_ids for c in torch_out] == out


@pytest.mark.parametrize("path", params([TRITON_BF16]))
def test_triton_backend_in_bf16_agrees_with_torch_in_bf16(tiny_model_dir, path):
    kw = dict(device=DEVICE, block_size=4, kv_cache_gib=0.01, max_num_batched_tokens=8)
    sampling = [greedy(n) for n in MAX_TOKENS]
    ours = [c.token_ids for c in path.llm(str(tiny_model_dir), **kw).generate(PROMPTS, sampling)]
    ref = [c.token_ids for c in BF16_TORCH.llm(str(tiny_model_dir), **kw).generate(PROMPTS, sampling)]
    agree = [greedy_prefix(r, o) for r, o in zip(ref, ours)]
    assert sum(agree) / sum(map(len, ref)) >= AGREE_BF16, agree
