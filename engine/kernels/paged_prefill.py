"""Paged prefill/extend attention: chunks of new query tokens over their cached prefix plus
themselves, causal, variable length, flash-style (online softmax, nothing of size L x L).

The step's K/V are written to the cache first (kv_write), so every key, cached or new, is read
from the paged cache through the chunk's block table. Query token i of a chunk with context L
and n new tokens sits at position L - n + i and sees keys 0 .. L - n + i.

Grid (query tile, chunk, KV head): the tiles go on the first axis, the only one not limited to
65,535 programs (a 64k-token chunk with 64 query heads per KV head is 65,536 tiles). A tile holds
TOKENS query tokens x the G query heads of one KV head, flattened to rows r = token * G + group
(GQA: each K/V tile is loaded once for them all).

Attention sinks (gpt-oss): each head's sink logit joins its rows' softmax denominator in the
epilogue, with no value.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.common import compute_in_fp32, dot_precision, next_pow2, soft_cap

BLOCK_R = 64  # query rows (tokens x heads of a group) per program
BLOCK_N = 64  # keys per inner iteration


@triton.jit(do_not_specialize=["stride_tc", "window"])  # per step (table width) or per layer
def _prefill_kernel(
    q_ptr,
    cache_ptr,
    tables_ptr,
    qstart_ptr,
    ctx_ptr,
    out_ptr,
    sinks_ptr,
    scale,
    window,
    softcap,
    stride_qt,
    stride_qh,  # q: [T, H, D]
    stride_cv,
    stride_ch,
    stride_cs,  # cache: [2, KVH, slots, D]
    stride_tc,  # tables: [C, max_blocks]
    stride_ot,
    stride_oh,  # out: [T, H, D]
    G: tl.constexpr,
    TOKENS: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    FP32: tl.constexpr,
    PRECISION: tl.constexpr,
    SOFTCAP: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    t0 = tl.program_id(0) * TOKENS
    c = tl.program_id(1)
    kvh = tl.program_id(2)
    row0 = tl.load(qstart_ptr + c)
    n_q = tl.load(qstart_ptr + c + 1) - row0
    if t0 < n_q:
        ctx = tl.load(ctx_ptr + c)
        prefix = ctx - n_q
        r = tl.arange(0, BLOCK_R)
        tok = t0 + r // G
        head = kvh * G + r % G
        rmask = (r < TOKENS * G) & (tok < n_q)
        d = tl.arange(0, D)
        q_off = (row0 + tok).to(tl.int64)[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :]
        q = tl.load(q_ptr + q_off, mask=rmask[:, None], other=0.0)
        if FP32:
            q = q.to(tl.float32)
        qpos = prefix + tok  # [BLOCK_R] absolute positions
        k_base = cache_ptr + kvh.to(tl.int64) * stride_ch  # int64: a cache may pass 2**31 elements
        v_base = k_base + stride_cv

        m_i = tl.full([BLOCK_R], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_R], tl.float32)
        acc = tl.zeros([BLOCK_R, D], tl.float32)
        hi = tl.minimum(ctx, prefix + t0 + TOKENS)  # one past the last key any row of the tile sees
        # a sliding layer: from the first key the tile's first row sees
        lo = tl.where(window > 0, tl.maximum(prefix + t0 - window + 1, 0), 0)
        for start in range(lo, hi, BLOCK_N):
            n = start + tl.arange(0, BLOCK_N)
            nmask = n < hi
            page = tl.load(tables_ptr + c * stride_tc + n // BLOCK_SIZE, mask=nmask, other=0).to(tl.int64)
            slot = page * BLOCK_SIZE + n % BLOCK_SIZE
            k = tl.load(k_base + slot[:, None] * stride_cs + d[None, :], mask=nmask[:, None], other=0.0)
            v = tl.load(v_base + slot[:, None] * stride_cs + d[None, :], mask=nmask[:, None], other=0.0)
            if FP32:
                k = k.to(tl.float32)
                v = v.to(tl.float32)
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # [BLOCK_R, BLOCK_N]
            if SOFTCAP:
                s = soft_cap(s, softcap)
            visible = nmask[None, :] & (n[None, :] <= qpos[:, None])
            visible = visible & ((window <= 0) | (n[None, :] > qpos[:, None] - window))
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            # a row may see no key of a tile yet (a window starts past it): keep its exps 0, not NaN
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp(m_i - m_use)
            p = tl.exp(s - m_use[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            m_i = m_new
        if HAS_SINKS:  # the sink's exp joins the denominator: rescale to max(m_i, sink)
            sink = tl.load(sinks_ptr + head).to(tl.float32)
            m_all = tl.maximum(m_i, sink)
            alpha = tl.exp(m_i - m_all)  # 0 where the row saw no key
            o = acc * alpha[:, None] / (l_i * alpha + tl.exp(sink - m_all))[:, None]
        else:
            o = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        o_off = (row0 + tok).to(tl.int64)[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :]
        tl.store(out_ptr + o_off, o.to(out_ptr.dtype.element_ty), mask=rmask[:, None])


def num_warps(head_dim: int) -> int:
    """8 warps above head dim 64 (as SGLang): with 4, a [64, 256] tile's accumulator spills (ptxas
    for sm_90a, tests/engine/kernels/test_offline_sm90.py)."""
    return 8 if head_dim > 64 else 4


def prefill_grid(chunks: int, max_query_len: int, group: int, num_kv_heads: int) -> tuple[int, int, int]:
    """(query tiles, chunks, KV heads): a tile is BLOCK_R // group tokens of one chunk."""
    return (-(-max_query_len // (BLOCK_R // group)), chunks, num_kv_heads)


def paged_prefill(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_starts: torch.Tensor,
    context_lens: torch.Tensor,
    max_query_len: int,
    block_size: int,
    scale: float,
    out: torch.Tensor | None = None,
    window: int = 0,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """q: [T, H, D] packed query rows; kv_cache: [2, KVH, slots, D] already holding this step's K/V;
    block_tables: [C, max_blocks]; query_starts: [C + 1] rows of q (chunk c is rows
    query_starts[c] .. query_starts[c+1]); context_lens: [C] cached prefix + new tokens.
    Writes the chunks' rows of `out` ([T, H, D], q's dtype) and returns it. window > 0: each query
    sees its last `window` keys, itself included; softcap > 0: scores soft-capped by tanh; sinks:
    [H] fp32 attention-sink logits."""
    _, H, D = q.shape
    KVH = kv_cache.shape[1]
    G = H // KVH
    assert D == next_pow2(D), "head_dim must be a power of two"
    assert G <= BLOCK_R, f"at most {BLOCK_R} query heads per KV head"
    assert sinks is None or (sinks.shape == (H,) and sinks.dtype == torch.float32), "sinks: [H] fp32"
    out = torch.empty_like(q) if out is None else out
    C = context_lens.shape[0]
    if C == 0:
        return out
    _prefill_kernel[prefill_grid(C, max_query_len, G, KVH)](
        q,
        kv_cache,
        block_tables,
        query_starts,
        context_lens,
        out,
        sinks,
        scale,
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
        G=G,
        TOKENS=BLOCK_R // G,
        BLOCK_R=BLOCK_R,
        BLOCK_N=BLOCK_N,
        D=D,
        BLOCK_SIZE=block_size,
        FP32=compute_in_fp32(q.dtype),
        PRECISION=dot_precision(q.dtype),
        num_warps=num_warps(D),
        SOFTCAP=softcap > 0,
        HAS_SINKS=sinks is not None,
    )
    return out
