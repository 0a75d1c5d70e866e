"""The Triton decode kernel against float64 attention over the same paged cache (interpreter on CPU)."""

import pytest
import torch
from kernel_reference import DEVICE, attention_ref, random_paged_kv, rel_err

from engine.kernels.paged_decode import paged_decode

TOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}


def run_case(lens, heads, kvh, d, block_size, dtype, seed, num_splits=None, window=0, sinks=None):
    gen = torch.Generator().manual_seed(seed)
    cache, tables, seqs = random_paged_kv(lens, kvh, d, block_size, dtype, gen)
    q = torch.randn(len(lens), heads, d, generator=gen).to(dtype)
    ctx = torch.tensor(lens)
    out = torch.full_like(q, float("nan"), device=DEVICE)  # poison: every element must be written
    paged_decode(
        q.to(DEVICE),
        cache.to(DEVICE),
        tables.to(DEVICE),
        ctx.to(DEVICE),
        block_size,
        d**-0.5,
        num_splits=num_splits,
        out=out,
        window=window,
        sinks=None if sinks is None else sinks.to(DEVICE),
    )
    out = out.cpu()
    for i, n in enumerate(lens):
        ref = attention_ref(q[i : i + 1], seqs[i][0], seqs[i][1], n - 1, window, sinks)
        assert rel_err(out[i : i + 1], ref) < TOL[dtype], (i, n)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("heads,kvh", [(2, 2), (8, 2), (8, 1)])  # GQA ratios 1, 4, 8
def test_decode_matches_reference(dtype, block_size, heads, kvh):
    run_case([1, 17, 64, 300], heads, kvh, 64, block_size, dtype, seed=block_size + heads)


@pytest.mark.parametrize("num_splits", [2, 5])
def test_split_context_reduces_to_the_same_answer(num_splits):
    # split-K along the context: some splits of the short sequences are empty
    run_case([3, 40, 257], 8, 2, 64, 16, torch.float32, seed=num_splits, num_splits=num_splits)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("window", [0, 100])
def test_sinks_join_the_denominator_once_across_splits(num_splits, window):
    # the sink is added in the one-split epilogue or once in the combine; some splits are empty
    sinks = torch.tensor([-3.0, 0.5, 2.0, 8.0, 1.0, -1.0, 4.0, 0.0])
    run_case(
        [1, 40, 257], 8, 2, 64, 16, torch.float32, seed=11, num_splits=num_splits, window=window, sinks=sinks
    )


def test_sinks_on_padding_rows_give_zeros():
    gen = torch.Generator().manual_seed(4)
    cache, tables, _ = random_paged_kv([20, 20], 2, 64, 16, torch.float32, gen)
    q = torch.randn(2, 4, 64, generator=gen)
    ctx, sinks = torch.tensor([20, 0]), torch.tensor([1.0, -2.0, 0.0, 3.0])
    for splits in (1, 3):
        out = paged_decode(
            q.to(DEVICE),
            cache.to(DEVICE),
            tables.to(DEVICE),
            ctx.to(DEVICE),
            16,
            0.125,
            num_splits=splits,
            sinks=sinks.to(DEVICE),
        ).cpu()
        assert torch.isfinite(out).all() and not out[1].any() and out[0].abs().sum() > 0


def test_head_dim_128_and_bf16_upcast():
    run_case([5, 130], 4, 1, 128, 16, torch.bfloat16, seed=7, num_splits=2)


def test_padding_rows_with_no_context_give_zeros():
    gen = torch.Generator().manual_seed(3)
    cache, tables, _ = random_paged_kv([20, 20], 2, 64, 16, torch.float32, gen)
    q = torch.randn(2, 4, 64, generator=gen)
    ctx = torch.tensor([20, 0])
    for splits in (1, 3):
        out = paged_decode(
            q.to(DEVICE), cache.to(DEVICE), tables.to(DEVICE), ctx.to(DEVICE), 16, 0.125, num_splits=splits
        ).cpu()
        assert torch.isfinite(out).all() and not out[1].any() and out[0].abs().sum() > 0


def test_a_wide_table_spreads_a_short_context_over_every_split():
    # a CUDA graph's table is max_model_len wide: a 512-token context must still give every one of
    # 8 splits work (not the first 512 / (8192 / 8) of them), and the answer stays right
    lens, d, splits = [512, 300], 64, 8
    gen = torch.Generator().manual_seed(5)
    cache, tables, seqs = random_paged_kv(lens, 2, d, 16, torch.float32, gen)
    wide = torch.zeros(len(lens), 8192 // 16, dtype=torch.int64)
    wide[:, : tables.shape[1]] = tables
    q = torch.randn(len(lens), 4, d, generator=gen)
    part_o = torch.full((2, 4, splits, d), float("nan"), device=DEVICE)
    part_lse = torch.full((2, 4, splits), float("nan"), device=DEVICE)
    out = paged_decode(
        q.to(DEVICE),
        cache.to(DEVICE),
        wide.to(DEVICE),
        torch.tensor(lens).to(DEVICE),
        16,
        d**-0.5,
        num_splits=splits,
        partials=(part_o, part_lse),
    ).cpu()
    assert torch.isfinite(part_lse[0]).all()  # 512 tokens: 8 tiles of 64, one a split
    assert torch.isfinite(part_lse[1, :, :5]).all()  # 300 tokens: 5 tiles
    for i, n in enumerate(lens):
        ref = attention_ref(q[i : i + 1], seqs[i][0], seqs[i][1], n - 1)
        assert rel_err(out[i : i + 1], ref) < 1e-5
