"""The cpu backend's bf16 decode kernel (engine/attention/csrc/paged_decode_bf16.h: AVX512-BF16
dot products, 16 tokens' scores reduced together, up to four query heads' value sums in registers)
against its fp32 kernel on the same bf16 values: head sizes on the fast path (64, 128) and off it
(16, 48), 1 to 5 query heads per KV head, contexts shorter and longer than 16 tokens and not a
multiple of 16, shuffled blocks of 8, 16 and 32 slots, windows, soft-capping and sinks."""

from __future__ import annotations

import pytest
import torch

from engine.attention import AttentionMetadata, make_backend

CONTEXTS = [1, 15, 16, 17, 50, 301]


def _decode_step(gen: torch.Generator, G: int, D: int, block_size: int):
    KVH = 2
    nblocks = [-(-n // block_size) for n in CONTEXTS]
    blocks = torch.randperm(sum(nblocks) + 3, generator=gen)
    tables, used = [], 0
    for nb in nblocks:
        tables.append(blocks[used : used + nb])
        used += nb
    width = max(nblocks)
    dec_tables = torch.stack([torch.cat([t, t.new_zeros(width - len(t))]) for t in tables])
    last = [n - 1 for n in CONTEXTS]  # each decode's new token
    slots = [int(t[i // block_size]) * block_size + i % block_size for t, i in zip(tables, last)]
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots),
        block_size=block_size,
        num_decodes=len(CONTEXTS),
        decode_block_tables=dec_tables,
        decode_context_lens=torch.tensor(CONTEXTS),
        prefills=[],
    )
    B = len(CONTEXTS)
    q, k, v = (torch.randn(B, h, D, generator=gen).bfloat16() for h in (G * KVH, KVH, KVH))
    cache = (torch.randn(2, KVH, len(blocks) * block_size, D, generator=gen) * 2).bfloat16()
    return q, k, v, cache, meta


@pytest.mark.parametrize("D", [16, 48, 64, 128])
@pytest.mark.parametrize("G", [1, 3, 5])
@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("window,softcap,with_sinks", [(0, 0.0, False), (20, 0.0, False), (0, 5.0, True)])
def test_bf16_kernel_equals_the_fp32_kernel_on_bf16_values(D, G, block_size, window, softcap, with_sinks):
    gen = torch.Generator().manual_seed(D * 100 + G * 10 + block_size + window)
    q, k, v, cache, meta = _decode_step(gen, G, D, block_size)
    sinks = torch.randn(2 * G, generator=gen) if with_sinks else None
    attn = make_backend("cpu", 2 * G, 2, D)
    got = attn.forward(q, k, v, cache.clone(), meta, window=window, softcap=softcap, sinks=sinks)
    meta.decode_int32 = None
    want = attn.forward(
        q.float(), k.float(), v.float(), cache.float(), meta, window=window, softcap=softcap, sinks=sinks
    )
    assert got.dtype == torch.bfloat16
    # fp32 sums in another order, one rounding to bf16: within an ulp of bf16 (2^-8 relative)
    assert torch.allclose(got.float(), want, rtol=2**-7, atol=1e-4)
    assert (got == want.bfloat16()).float().mean() > 0.97


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 7, 40])
def test_kv_write_puts_the_rows_where_index_copy_does(dtype, T):
    """The backend's one-call K/V write (`kv_write`) against the reference's two index_copy_, for K
    and V as the forward hands them over: views into the fused QKV output, rows apart."""
    gen = torch.Generator().manual_seed(T)
    H, KVH, D, S = 6, 2, 64, 256
    backend = make_backend("cpu", H, KVH, D)
    qkv = torch.randn(T, (H + 2 * KVH) * D, generator=gen).to(dtype)
    k = qkv[:, H * D : (H + KVH) * D].view(T, KVH, D)
    v = qkv[:, (H + KVH) * D :].view(T, KVH, D)
    slots = torch.randperm(S, generator=gen)[:T]
    cache = torch.randn(2, KVH, S, D, generator=gen).to(dtype)
    expected = cache.clone()
    expected[0].index_copy_(1, slots, k.transpose(0, 1))
    expected[1].index_copy_(1, slots, v.transpose(0, 1))
    backend.write_kv(k, v, cache, slots)
    assert torch.equal(cache, expected)
