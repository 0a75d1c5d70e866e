"""The Triton prefill/extend kernel against float64 causal attention (interpreter on CPU)."""

import pytest
import torch
from kernel_reference import DEVICE, attention_ref, random_paged_kv, rel_err

from engine.kernels.paged_prefill import paged_prefill, prefill_grid

TOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}


def run_case(chunks, heads, kvh, d, block_size, dtype, seed, window=0, sinks=None):
    """chunks: (cached prefix, new tokens) per sequence; the new tokens' K/V are in the cache too."""
    gen = torch.Generator().manual_seed(seed)
    lens = [p + n for p, n in chunks]
    cache, tables, seqs = random_paged_kv(lens, kvh, d, block_size, dtype, gen)
    starts = [0]
    for _, n in chunks:
        starts.append(starts[-1] + n)
    q = torch.randn(starts[-1] + 2, heads, d, generator=gen).to(dtype)  # 2 rows no chunk owns
    out = torch.full_like(q, float("nan"), device=DEVICE)
    paged_prefill(
        q.to(DEVICE),
        cache.to(DEVICE),
        tables.to(DEVICE),
        torch.tensor(starts).to(DEVICE),
        torch.tensor(lens).to(DEVICE),
        max(n for _, n in chunks),
        block_size,
        d**-0.5,
        out=out,
        window=window,
        sinks=None if sinks is None else sinks.to(DEVICE),
    )
    out = out.cpu()
    for i, (p, n) in enumerate(chunks):
        rows = slice(starts[i], starts[i] + n)
        ref = attention_ref(q[rows], seqs[i][0], seqs[i][1], p, window, sinks)
        assert rel_err(out[rows], ref) < TOL[dtype], (i, p, n)
    assert out[starts[-1] :].isnan().all()  # rows outside every chunk are left alone


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("heads,kvh", [(2, 2), (8, 2), (8, 1)])  # GQA ratios 1, 4, 8
def test_prefill_without_cached_prefix(dtype, block_size, heads, kvh):
    run_case([(0, 1), (0, 37), (0, 150)], heads, kvh, 64, block_size, dtype, seed=heads + block_size)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("heads,kvh", [(2, 2), (8, 2), (8, 1)])
def test_extend_over_a_cached_prefix(dtype, heads, kvh):
    run_case([(16, 1), (45, 20), (200, 90), (3, 70)], heads, kvh, 64, 16, dtype, seed=heads)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [0, 24])
def test_sinks_in_chunked_prefill(dtype, window):
    # a prompt's first chunk and later chunks over their cached prefix, GQA 4, the window biting
    sinks = torch.tensor([-3.0, 0.5, 2.0, 8.0, 1.0, -1.0, 4.0, 0.0])
    run_case([(0, 37), (45, 20), (3, 70)], 8, 2, 64, 16, dtype, seed=13, window=window, sinks=sinks)


def test_group_of_three_heads_and_head_dim_128_in_bf16():
    # SmolLM2 has 9 query heads over 3 KV heads: rows of a tile do not divide evenly into groups
    run_case([(0, 30), (33, 40)], 9, 3, 128, 32, torch.bfloat16, seed=5)


def test_grid_stays_within_cuda_limits_for_long_chunks_and_large_groups():
    # CUDA grids allow 2**31 - 1 programs on the first axis, 65,535 on the others
    tiles, chunks, kv_heads = prefill_grid(4, 131072, 64, 8)
    assert tiles == 131072 and chunks == 4 and kv_heads == 8
    assert chunks <= 65535 and kv_heads <= 65535 and tiles < 2**31
