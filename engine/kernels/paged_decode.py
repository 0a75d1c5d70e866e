"""Paged-attention decode: one query token per sequence against its paged K/V.

Grid (batch, KV head, split). A program loads the G query heads that share its KV head as one
[G_PAD, D] tile, so each K/V block is read from memory once for the whole group (GQA), and
walks its split of the context in tiles of BLOCK_N tokens with an online softmax. With one split
it writes the output directly; with several (long contexts, or too few sequences x KV heads to
fill the GPU) each split writes a normalised partial output and its log-sum-exp, and a second
kernel combines them. A sequence with context 0 (a padding row) gets a zero output.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.common import compute_in_fp32, dot_precision, next_pow2, programs_wanted, soft_cap

BLOCK_N = 64  # K/V tokens per inner iteration (several cache blocks)
MIN_SPLIT_TOKENS = 256  # a split shorter than this costs more in the reduce than it gains


@triton.jit
def _decode_kernel(
    q_ptr,
    cache_ptr,
    tables_ptr,
    ctx_ptr,
    out_ptr,
    part_o_ptr,
    part_lse_ptr,
    scale,
    window,
    softcap,
    blocks_per_split,
    stride_qb,
    stride_qh,  # q: [B, H, D]
    stride_cv,
    stride_ch,
    stride_cs,  # cache: [2, KVH, slots, D]
    stride_tb,  # tables: [B, max_blocks]
    stride_ob,
    stride_oh,  # out: [B, H, D]
    stride_pb,
    stride_ph,
    stride_ps,  # part_o: [B, H, S, D]; part_lse: [B, H, S] contiguous
    G: tl.constexpr,
    G_PAD: tl.constexpr,
    D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    FP32: tl.constexpr,
    PRECISION: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(ctx_ptr + b)
    lo = split * blocks_per_split * BLOCK_SIZE
    hi = tl.minimum(ctx, lo + blocks_per_split * BLOCK_SIZE)
    lo = tl.maximum(lo, tl.where(window > 0, ctx - window, 0))  # a sliding layer: its last `window` tokens

    g = tl.arange(0, G_PAD)
    d = tl.arange(0, D)
    head = kvh * G + g
    gmask = g < G
    q = tl.load(
        q_ptr + b * stride_qb + head[:, None] * stride_qh + d[None, :], mask=gmask[:, None], other=0.0
    )
    if FP32:
        q = q.to(tl.float32)
    k_base = cache_ptr + kvh.to(tl.int64) * stride_ch  # int64: a cache may pass 2**31 elements
    v_base = k_base + stride_cv

    m_i = tl.full([G_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, D], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        nmask = n < hi
        page = tl.load(tables_ptr + b * stride_tb + n // BLOCK_SIZE, mask=nmask, other=0).to(tl.int64)
        slot = page * BLOCK_SIZE + n % BLOCK_SIZE  # [BLOCK_N]
        k = tl.load(k_base + slot[:, None] * stride_cs + d[None, :], mask=nmask[:, None], other=0.0)
        v = tl.load(v_base + slot[:, None] * stride_cs + d[None, :], mask=nmask[:, None], other=0.0)
        if FP32:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # [G_PAD, BLOCK_N]
        if SOFTCAP:
            s = soft_cap(s, softcap)
        s = tl.where(nmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new

    empty = l_i == 0.0  # no token in this split (or a padding row)
    o = acc / tl.where(empty, 1.0, l_i)[:, None]
    if NUM_SPLITS == 1:
        tl.store(
            out_ptr + b * stride_ob + head[:, None] * stride_oh + d[None, :],
            o.to(out_ptr.dtype.element_ty),
            mask=gmask[:, None],
        )
    else:
        lse = tl.where(empty, float("-inf"), m_i + tl.log(tl.where(empty, 1.0, l_i)))
        row = b * stride_pb + head * stride_ph + split * stride_ps  # [G_PAD]
        tl.store(part_o_ptr + row[:, None] + d[None, :], o, mask=gmask[:, None])
        tl.store(part_lse_ptr + row // D, lse, mask=gmask)


@triton.jit
def _reduce_kernel(
    part_o_ptr,
    part_lse_ptr,
    out_ptr,
    stride_pb,
    stride_ph,
    stride_ps,
    stride_ob,
    stride_oh,
    NUM_SPLITS: tl.constexpr,
    S_PAD: tl.constexpr,
    D: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, S_PAD)
    d = tl.arange(0, D)
    row = b * stride_pb + h * stride_ph + s * stride_ps  # [S_PAD]
    smask = s < NUM_SPLITS
    lse = tl.load(part_lse_ptr + row // D, mask=smask, other=float("-inf"))
    o = tl.load(part_o_ptr + row[:, None] + d[None, :], mask=smask[:, None], other=0.0)
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp(lse - m)  # [S_PAD]; 0 for empty splits
    total = tl.sum(w, 0)
    res = tl.sum(o * w[:, None], 0) / tl.where(total == 0.0, 1.0, total)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + d, res.to(out_ptr.dtype.element_ty))


def choose_splits(
    batch: int, num_kv_heads: int, max_blocks: int, block_size: int, device: torch.device
) -> int:
    """Splits along the context: enough programs to fill the GPU, none shorter than MIN_SPLIT_TOKENS.
    Depends only on shapes, so a CUDA graph captured at a shape keeps its split."""
    by_length = max(1, max_blocks * block_size // MIN_SPLIT_TOKENS)
    by_occupancy = max(1, -(-programs_wanted(device) // (batch * num_kv_heads)))
    return min(by_length, by_occupancy)


def paged_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    block_size: int,
    scale: float,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
    window: int = 0,
    softcap: float = 0.0,
) -> torch.Tensor:
    """q: [B, H, D]; kv_cache: [2, KVH, slots, D]; block_tables: [B, max_blocks] int; context_lens:
    [B] int (tokens in the cache, the new one included). Returns [B, H, D] in q's dtype.
    window > 0: each query sees its last `window` tokens; softcap > 0: scores soft-capped by tanh."""
    B, H, D = q.shape
    KVH = kv_cache.shape[1]
    G = H // KVH
    assert D == next_pow2(D), "head_dim must be a power of two"
    assert q.stride(-1) == 1 and kv_cache.stride(-1) == 1
    out = torch.empty_like(q) if out is None else out
    if B == 0:
        return out
    max_blocks = block_tables.shape[1]
    splits = num_splits or choose_splits(B, KVH, max_blocks, block_size, q.device)
    blocks_per_split = -(-max_blocks // splits)
    splits = -(-max_blocks // blocks_per_split)
    if splits > 1:
        part_o = torch.empty(B, H, splits, D, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(B, H, splits, dtype=torch.float32, device=q.device)
    else:
        part_o = part_lse = out  # unused
    _decode_kernel[(B, KVH, splits)](
        q,
        kv_cache,
        block_tables,
        context_lens,
        out,
        part_o,
        part_lse,
        scale,
        window,
        softcap,
        blocks_per_split,
        q.stride(0),
        q.stride(1),
        kv_cache.stride(0),
        kv_cache.stride(1),
        kv_cache.stride(2),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        H * splits * D,
        splits * D,
        D,
        G=G,
        G_PAD=max(16, next_pow2(G)),
        D=D,
        BLOCK_SIZE=block_size,
        BLOCK_N=BLOCK_N,
        NUM_SPLITS=splits,
        FP32=compute_in_fp32(q.dtype),
        PRECISION=dot_precision(q.dtype),
        SOFTCAP=softcap > 0,
    )
    if splits > 1:
        _reduce_kernel[(B, H)](
            part_o,
            part_lse,
            out,
            H * splits * D,
            splits * D,
            D,
            out.stride(0),
            out.stride(1),
            NUM_SPLITS=splits,
            S_PAD=next_pow2(splits),
            D=D,
        )
    return out
