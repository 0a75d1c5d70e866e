"""The cpu backend's bf16 prefill kernel (engine/attention/csrc/paged_prefill_bf16.h: AVX512-BF16
scores, online softmax over tiles of 16 keys, fp32 value sums, one rounding to bf16) against the
torch reference in fp32 on the same bf16 values: head sizes 64 and 128 (and 48, which takes the
SDPA path), 1, 3 and 4 query heads per KV head, steps with decodes and several chunks (a fresh
prompt, chunks over cached prefixes of all lengths, chunks shorter and longer than the kernel's
16-query blocks), shuffled blocks of 8 and 16 slots, windows, soft-capping and sinks."""

from __future__ import annotations

import pytest
import torch

from engine.attention import AttentionMetadata, PrefillChunk, make_backend

KVH = 2
DECODES = [9, 40]  # context lengths, the new token included
CHUNKS = [(0, 37), (21, 50), (100, 5), (3, 1), (0, 16)]  # (cached prefix, new tokens)


def _step(gen: torch.Generator, G: int, D: int, block_size: int):
    """Decodes, then prefill chunks, each sequence on shuffled blocks of a shared cache whose
    cached prefixes are random."""
    lens = DECODES + [p + n for p, n in CHUNKS]
    blocks = torch.randperm(sum(-(-n // block_size) for n in lens) + 2, generator=gen)
    tables, used = [], 0
    for n in lens:
        nb = -(-n // block_size)
        tables.append(blocks[used : used + nb])
        used += nb
    nd = len(DECODES)
    width = max(len(t) for t in tables[:nd])
    dec_tables = torch.stack([torch.cat([t, t.new_zeros(width - len(t))]) for t in tables[:nd]])
    bs = block_size
    slots = [int(tables[i][(n - 1) // bs]) * bs + (n - 1) % bs for i, n in enumerate(DECODES)]
    prefills, row = [], nd
    for (p, n), table in zip(CHUNKS, tables[nd:]):
        slots += (table[:, None] * block_size + torch.arange(block_size)).reshape(-1)[p : p + n].tolist()
        prefills.append(PrefillChunk(row, n, p + n, table))
        row += n
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots),
        block_size=block_size,
        num_decodes=nd,
        decode_block_tables=dec_tables,
        decode_context_lens=torch.tensor(DECODES),
        prefills=prefills,
    )
    q, k, v = (torch.randn(row, h, D, generator=gen).bfloat16() for h in (G * KVH, KVH, KVH))
    cache = torch.randn(2, KVH, len(blocks) * block_size, D, generator=gen).bfloat16()
    return q, k, v, cache, meta


def _forward(name: str, G: int, D: int, q, k, v, cache, meta, **kw) -> torch.Tensor:
    meta.decode_int32 = meta.prefill_int32 = None
    return make_backend(name, G * KVH, KVH, D).forward(q, k, v, cache.clone(), meta, **kw)


def _fp32_reference(G: int, D: int, q, k, v, cache, meta, **kw) -> torch.Tensor:
    return _forward("torch", G, D, q.float(), k.float(), v.float(), cache.float(), meta, **kw)


KERNEL = bool(make_backend("cpu", 6, 2, 64).lib.paged_prefill_bf16_supported(64))
NO_KERNEL = "this CPU has no AVX512-BF16: bf16 prefill chunks take the SDPA path"
SDPA_TOL = 3e-2  # SDPA in bf16 rounds its probabilities to bf16 before the value sum


def test_the_kernel_runs_for_bf16_head_sizes_that_are_multiples_of_32():
    if not KERNEL:
        pytest.skip(NO_KERNEL)
    assert make_backend("cpu", 6, 2, 64).prefill_kernel and make_backend("cpu", 6, 2, 128).prefill_kernel
    assert not make_backend("cpu", 6, 2, 48).prefill_kernel


@pytest.mark.parametrize("D", [48, 64, 128])
@pytest.mark.parametrize("G", [1, 3, 4])
@pytest.mark.parametrize("block_size", [8, 16])
@pytest.mark.parametrize(
    "window,softcap,with_sinks", [(0, 0.0, False), (20, 0.0, False), (0, 5.0, True), (7, 3.0, True)]
)
def test_bf16_prefill_equals_the_fp32_reference_rounded(D, G, block_size, window, softcap, with_sinks):
    gen = torch.Generator().manual_seed(D * 100 + G * 10 + block_size + window)
    q, k, v, cache, meta = _step(gen, G, D, block_size)
    kw = dict(window=window, softcap=softcap, sinks=torch.randn(2 * G, generator=gen) if with_sinks else None)
    got = _forward("cpu", G, D, q, k, v, cache, meta, **kw)
    want = _fp32_reference(G, D, q, k, v, cache, meta, **kw)
    assert got.dtype == torch.bfloat16
    rows = slice(len(DECODES), None)  # the chunks' rows
    if make_backend("cpu", 2 * G, KVH, D).prefill_kernel:
        # fp32 sums in another order, one rounding to bf16: within an ulp of bf16 (2^-8 relative)
        assert torch.allclose(got[rows].float(), want[rows], rtol=2**-7, atol=1e-4)
        assert (got[rows] == want[rows].bfloat16()).float().mean() > 0.99
    else:
        assert (got[rows].float() - want[rows]).abs().max() < SDPA_TOL
    assert torch.allclose(got[: len(DECODES)].float(), want[: len(DECODES)], rtol=2**-7, atol=1e-4)


@pytest.mark.parametrize("G", [1, 3])
def test_bf16_prefill_is_closer_than_sdpa(G):
    """Against the fp32 reference, the kernel's error is smaller than the SDPA path's on the
    same bf16 step (SDPA rounds the probabilities to bf16 before the value sum)."""
    if not KERNEL:
        pytest.skip(NO_KERNEL)
    gen = torch.Generator().manual_seed(G)
    q, k, v, cache, meta = _step(gen, G, 64, 16)
    want = _fp32_reference(G, 64, q, k, v, cache, meta)
    got = _forward("cpu", G, 64, q, k, v, cache, meta)
    sdpa = _forward("torch", G, 64, q, k, v, cache, meta)
    rows = slice(len(DECODES), None)
    err = (got[rows].float() - want[rows]).abs()
    sdpa_err = (sdpa[rows].float() - want[rows]).abs()
    assert err.max() <= sdpa_err.max() and err.mean() < sdpa_err.mean()


def test_a_long_chunk_over_a_long_prefix():
    """Query blocks and key tiles far from aligned: 300 new tokens after 333 cached ones, GQA 3."""
    gen = torch.Generator().manual_seed(5)
    bs, G, D, (p, n) = 16, 3, 64, (333, 300)
    table = torch.randperm(-(-(p + n) // bs) + 3, generator=gen)[: -(-(p + n) // bs)]
    slots = (table[:, None] * bs + torch.arange(bs)).reshape(-1)[p : p + n]
    meta = AttentionMetadata(slots, bs, 0, None, None, [PrefillChunk(0, n, p + n, table)])
    q, k, v = (torch.randn(n, h, D, generator=gen).bfloat16() for h in (G * KVH, KVH, KVH))
    cache = torch.randn(2, KVH, (len(table) + 3) * bs, D, generator=gen).bfloat16()
    for window in (0, 1, 40, 10_000):
        got = _forward("cpu", G, D, q, k, v, cache, meta, window=window)
        want = _fp32_reference(G, D, q, k, v, cache, meta, window=window)
        if KERNEL:
            assert torch.allclose(got.float(), want, rtol=2**-7, atol=1e-4)
        else:
            assert (got.float() - want).abs().max() < SDPA_TOL


def test_queries_in_another_memory_layout():
    """q as [H, T, D] memory seen as [T, H, D] (the output then takes its strides too)."""
    gen = torch.Generator().manual_seed(6)
    q, k, v, cache, meta = _step(gen, 3, 64, 16)
    strided = q.transpose(0, 1).contiguous().transpose(0, 1)
    assert not strided.is_contiguous()
    want = _forward("cpu", 3, 64, q, k, v, cache, meta)
    got = _forward("cpu", 3, 64, strided, k, v, cache, meta)
    assert torch.equal(got, want)
