"""Paged-attention decode: one query token per sequence against its paged K/V.

Grid (batch, KV head, split). A program loads the G query heads that share its KV head as one
[G_PAD, D] tile, so each K/V block is read from memory once for the whole group (GQA), and
walks its split of the context in tiles of BLOCK_N tokens with an online softmax. With one split
it writes the output directly; with several (long contexts, or too few sequences x KV heads to
fill the GPU) each split writes a normalised partial output and its log-sum-exp, and a second
kernel combines them. A sequence with context 0 (a padding row) gets a zero output.

Attention sinks (gpt-oss): each head's sink logit joins its softmax's denominator once, with no
value: in the decode program's epilogue with one split, in the combine with several.

The split count is a run-time argument, and each sequence divides its own context across the
splits (in whole BLOCK_N tiles): a CUDA graph captured for the longest context still spreads a
short context over all its programs. Arguments that vary from step to step (the split count, the
block-table width) are `do_not_specialize`: one compiled variant serves every step.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.common import compute_in_fp32, dot_precision, next_pow2, programs_wanted, soft_cap

BLOCK_N = 64  # K/V tokens per inner iteration (several cache blocks)
MIN_SPLIT_TOKENS = 256  # a split shorter than this costs more in the reduce than it gains
MAX_SPLITS = 64  # more programs than this per (sequence, KV head) never pays on an H100
REDUCE_CHUNK = 16  # splits the reduce kernel combines per iteration
# ints that change from step to step: never specialised (Triton specialises 1 and multiples of 16)
DECODE_VARYING = ["num_splits", "window", "stride_tb", "stride_pb", "stride_ph", "stride_ps"]


def num_warps(head_dim: int, dtype: torch.dtype) -> int:
    """4 warps up to head dim 128 (64 for fp32); 8 above, where the fp32 accumulator and K/V tiles
    spill from 4 warps' registers (ptxas for sm_90a: tests/engine/kernels/test_offline_sm90.py)."""
    return 8 if head_dim > 128 or (dtype == torch.float32 and head_dim > 64) else 4


@triton.jit(do_not_specialize=DECODE_VARYING)
def _decode_kernel(
    q_ptr,
    cache_ptr,
    tables_ptr,
    ctx_ptr,
    out_ptr,
    part_o_ptr,
    part_lse_ptr,
    sinks_ptr,
    scale,
    num_splits,
    window,
    softcap,
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
    FP32: tl.constexpr,
    PRECISION: tl.constexpr,
    SOFTCAP: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(ctx_ptr + b).to(tl.int32)
    first = tl.where(window > 0, tl.maximum(ctx - window, 0), 0)  # a sliding layer: its last `window`
    tiles_per_split = tl.cdiv(tl.cdiv(ctx - first, BLOCK_N), num_splits)  # this sequence's own context
    lo = first + split * tiles_per_split * BLOCK_N
    hi = tl.minimum(ctx, lo + tiles_per_split * BLOCK_N)

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
    if num_splits == 1:
        if HAS_SINKS:  # the sink's exp joins the denominator: rescale to max(m_i, sink)
            sink = tl.load(sinks_ptr + head, mask=gmask, other=0.0).to(tl.float32)
            m_all = tl.maximum(m_i, sink)
            alpha = tl.exp(m_i - m_all)  # 0 where the row saw no key
            o = acc * alpha[:, None] / (l_i * alpha + tl.exp(sink - m_all))[:, None]
        else:
            o = acc / tl.where(empty, 1.0, l_i)[:, None]
        tl.store(
            out_ptr + b * stride_ob + head[:, None] * stride_oh + d[None, :],
            o.to(out_ptr.dtype.element_ty),
            mask=gmask[:, None],
        )
    else:
        o = acc / tl.where(empty, 1.0, l_i)[:, None]
        lse = tl.where(empty, float("-inf"), m_i + tl.log(tl.where(empty, 1.0, l_i)))
        row = b * stride_pb + head * stride_ph + split * stride_ps  # [G_PAD]
        tl.store(part_o_ptr + row[:, None] + d[None, :], o, mask=gmask[:, None])
        tl.store(part_lse_ptr + row // D, lse, mask=gmask)


@triton.jit(do_not_specialize=DECODE_VARYING)
def _reduce_kernel(
    part_o_ptr,
    part_lse_ptr,
    out_ptr,
    sinks_ptr,
    num_splits,
    stride_pb,
    stride_ph,
    stride_ps,
    stride_ob,
    stride_oh,
    CHUNK: tl.constexpr,
    D: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    d = tl.arange(0, D)
    base = b * stride_pb + h * stride_ph
    m = tl.full([CHUNK], float("-inf"), tl.float32)
    for s0 in range(0, num_splits, CHUNK):  # pass 1: the largest log-sum-exp
        s = s0 + tl.arange(0, CHUNK)
        lse = tl.load(part_lse_ptr + (base + s * stride_ps) // D, mask=s < num_splits, other=float("-inf"))
        m = tl.maximum(m, lse)
    m_all = tl.max(m, 0)
    if HAS_SINKS:  # the head's sink: one more term of the denominator, added once
        sink = tl.load(sinks_ptr + h).to(tl.float32)
        m_all = tl.maximum(m_all, sink)
    m_all = tl.where(m_all == float("-inf"), 0.0, m_all)
    total = tl.zeros([CHUNK], tl.float32)
    acc = tl.zeros([D], tl.float32)
    for s0 in range(0, num_splits, CHUNK):  # pass 2: the weighted sum
        s = s0 + tl.arange(0, CHUNK)
        row = base + s * stride_ps  # [CHUNK]
        smask = s < num_splits
        lse = tl.load(part_lse_ptr + row // D, mask=smask, other=float("-inf"))
        o = tl.load(part_o_ptr + row[:, None] + d[None, :], mask=smask[:, None], other=0.0)
        w = tl.exp(lse - m_all)  # 0 for empty splits
        total += w
        acc += tl.sum(o * w[:, None], 0)
    t = tl.sum(total, 0)
    if HAS_SINKS:
        t += tl.exp(sink - m_all)
    res = acc / tl.where(t == 0.0, 1.0, t)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + d, res.to(out_ptr.dtype.element_ty))


def choose_splits(
    batch: int, num_kv_heads: int, max_blocks: int, block_size: int, device: torch.device
) -> int:
    """Splits along the context: enough programs to fill the GPU, none shorter than MIN_SPLIT_TOKENS
    at the table's width, at most MAX_SPLITS. Depends only on shapes, so a CUDA graph captured at a
    shape keeps its split count; each sequence spreads its own context over them (the kernel)."""
    by_length = max(1, max_blocks * block_size // MIN_SPLIT_TOKENS)
    by_occupancy = max(1, -(-programs_wanted(device) // (batch * num_kv_heads)))
    return min(by_length, by_occupancy, MAX_SPLITS)


def paged_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    block_size: int,
    scale: float,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
    partials: tuple[torch.Tensor, torch.Tensor] | None = None,
    window: int = 0,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """q: [B, H, D]; kv_cache: [2, KVH, slots, D]; block_tables: [B, max_blocks] int; context_lens:
    [B] int (tokens in the cache, the new one included). Returns [B, H, D] in q's dtype.
    `partials`: the split outputs and log-sum-exps ([B, H, S, D], [B, H, S] fp32) to use, with
    S >= the split count (default: allocated here). window > 0: each query sees its last `window`
    tokens; softcap > 0: scores soft-capped by tanh; sinks: [H] fp32 attention-sink logits."""
    B, H, D = q.shape
    KVH = kv_cache.shape[1]
    G = H // KVH
    assert D == next_pow2(D), "head_dim must be a power of two"
    assert q.stride(-1) == 1 and kv_cache.stride(-1) == 1
    assert sinks is None or (sinks.shape == (H,) and sinks.dtype == torch.float32), "sinks: [H] fp32"
    out = torch.empty_like(q) if out is None else out
    if B == 0:
        return out
    max_blocks = block_tables.shape[1]
    splits = num_splits or choose_splits(B, KVH, max_blocks, block_size, q.device)
    splits = max(1, min(splits, -(-max_blocks * block_size // BLOCK_N)))  # no split without a tile
    # fp32 partials even with one split (unused then): the pointer types never change the variant
    if partials is None:
        part_o = torch.empty(B, H, splits, D, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(B, H, splits, dtype=torch.float32, device=q.device)
    else:
        part_o, part_lse = partials
        assert part_o.is_contiguous() and part_lse.is_contiguous() and part_o.shape[2] >= splits
    S = part_o.shape[2]  # partial rows a (sequence, head) owns; the first `splits` are written
    warps = num_warps(D, q.dtype)
    _decode_kernel[(B, KVH, splits)](
        q,
        kv_cache,
        block_tables,
        context_lens,
        out,
        part_o,
        part_lse,
        sinks,
        scale,
        splits,
        window,
        softcap,
        q.stride(0),
        q.stride(1),
        kv_cache.stride(0),
        kv_cache.stride(1),
        kv_cache.stride(2),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        H * S * D,
        S * D,
        D,
        G=G,
        G_PAD=max(16, next_pow2(G)),
        D=D,
        BLOCK_SIZE=block_size,
        BLOCK_N=BLOCK_N,
        FP32=compute_in_fp32(q.dtype),
        PRECISION=dot_precision(q.dtype),
        num_warps=warps,
        SOFTCAP=softcap > 0,
        HAS_SINKS=sinks is not None,
    )
    if splits > 1:
        _reduce_kernel[(B, H)](
            part_o,
            part_lse,
            out,
            sinks,
            splits,
            H * S * D,
            S * D,
            D,
            out.stride(0),
            out.stride(1),
            CHUNK=REDUCE_CHUNK,
            D=D,
            HAS_SINKS=sinks is not None,
        )
    return out
