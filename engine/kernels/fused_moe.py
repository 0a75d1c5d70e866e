"""Fused mixture-of-experts feed-forward as two grouped GEMMs over the step's routed rows (the GPU
path), after vLLM's and SGLang's fused_moe.

A step's T tokens are routed to k experts each: n = T * k rows, row t * k + j being token t at its
j-th expert. The rows are sorted by expert and each expert's run padded to a multiple of BLOCK_M
(moe_reference.align_tokens), so every block of BLOCK_M sorted rows belongs to one expert. Then:

1. gate/up: grid (row blocks x I tiles). A program gathers its rows' tokens from x, multiplies
   them by its expert's gate and up columns (two accumulators over the same x tile) and applies
   the activation in the epilogue (bias first): h [n, I] in x's dtype, no [n, 2I] round trip.
2. down: grid (row blocks x H tiles) over h, bias and routing weight in the epilogue, into fp32
   y [n, H]; the k rows of each token are summed (torch) and cast to x's dtype.

An expert's weights are read by the programs of its blocks only: a batch reads the experts it
touches, and at decode (a few rows per expert, one block each) each of them once. Blocks past the
padded length (the sizes are bounds, fixed by T and k: nothing syncs with the host) do nothing.
Tiles by expected rows per expert (choose_config): BLOCK_M 16 for decode-sized batches, 64 above.
The arithmetic is moe_reference.fused_moe_reference's: fp32 accumulation, the activation in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from engine.kernels.common import compute_in_fp32, dot_precision
from engine.kernels.moe_reference import align_tokens, check_moe_args, fused_moe_reference

__all__ = ["CONFIGS", "MoEConfig", "choose_config", "fused_moe", "fused_moe_reference"]

# ints that change from step to step (row counts, padded lengths): never specialised
MOE_VARYING = ["num_rows", "num_blocks_m"]
ACT_IDS = {"silu": 0, "swigluoai": 1}


@dataclass(frozen=True)
class MoEConfig:
    block_m: int  # sorted rows per program: each block belongs to one expert
    block_n: int  # output columns per program
    block_k: int  # reduction step
    group_m: int  # row blocks that walk the column tiles together (L2 reuse of the weights)
    num_warps: int = 4


DECODE_CONFIG = MoEConfig(block_m=16, block_n=64, block_k=128, group_m=1)
PREFILL_CONFIG = MoEConfig(block_m=64, block_n=64, block_k=64, group_m=8)
CONFIGS = (DECODE_CONFIG, PREFILL_CONFIG)  # a warm-up compiles each (`fused_moe(..., config=)`)


def choose_config(num_rows: int, num_experts: int) -> MoEConfig:
    """Two tile shapes, so two compiled variants per kernel and dtype: decode-sized batches (at most
    16 rows per expert on average) in 16-row blocks, so an expert's weights are read once and little
    of a block is padding; larger batches in 64-row blocks, which reuse each weight tile 64 times."""
    return DECODE_CONFIG if num_rows <= 16 * num_experts else PREFILL_CONFIG


@triton.jit
def _block_of(pid, num_blocks_m, num_tiles_n, GROUP_M: tl.constexpr):
    """(row block, column tile) of program `pid`, GROUP_M row blocks sharing each column tile in turn."""
    per_group = GROUP_M * num_tiles_n
    group = pid // per_group
    first_m = group * GROUP_M
    size_m = tl.minimum(num_blocks_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % size_m
    pid_n = (pid % per_group) // size_m
    return pid_m, pid_n


@triton.jit(do_not_specialize=MOE_VARYING)
def _moe_gate_up_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    h_ptr,
    sorted_ptr,
    block_expert_ptr,
    num_padded_ptr,
    num_rows,
    num_blocks_m,
    H,
    inter,
    swiglu_limit,
    swiglu_alpha,
    stride_xt,  # x: [T, H], unit stride along H
    stride_we,
    stride_wn,
    stride_wk,  # w_gate_up: [E, 2I, H]
    stride_be,  # b_gate_up: [E, 2I], unit stride
    stride_ht,  # h: [n, I], unit stride
    TOP_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    ACT: tl.constexpr,  # 0 silu, 1 swigluoai
    CLAMP: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    FP32: tl.constexpr,
    PRECISION: tl.constexpr,
):
    pid_m, pid_n = _block_of(tl.program_id(0), num_blocks_m, tl.cdiv(inter, BLOCK_N), GROUP_M)
    if pid_m * BLOCK_M < tl.load(num_padded_ptr):
        rows = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        rmask = rows < num_rows
        tokens = rows // TOP_K
        e = tl.load(block_expert_ptr + pid_m).to(tl.int64)
        n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        nmask = n < inter
        if INTERLEAVED:  # gate 2j, up 2j + 1 (gpt-oss)
            gate_rows = 2 * n
            up_rows = 2 * n + 1
        else:  # gate j, up I + j
            gate_rows = n
            up_rows = n + inter
        kk = tl.arange(0, BLOCK_K)
        x_ptrs = x_ptr + tokens[:, None] * stride_xt + kk[None, :]  # [BLOCK_M, BLOCK_K]
        w_base = w_ptr + e * stride_we + kk[:, None] * stride_wk  # [BLOCK_K, 1]
        g_ptrs = w_base + gate_rows[None, :].to(tl.int64) * stride_wn  # [BLOCK_K, BLOCK_N]
        u_ptrs = w_base + up_rows[None, :].to(tl.int64) * stride_wn
        acc_g = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        acc_u = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, H, BLOCK_K):
            kmask = kk < H - k0
            a = tl.load(x_ptrs, mask=rmask[:, None] & kmask[None, :], other=0.0)
            wg = tl.load(g_ptrs, mask=kmask[:, None] & nmask[None, :], other=0.0)
            wu = tl.load(u_ptrs, mask=kmask[:, None] & nmask[None, :], other=0.0)
            if FP32:
                a = a.to(tl.float32)
                wg = wg.to(tl.float32)
                wu = wu.to(tl.float32)
            acc_g = tl.dot(a, wg, acc_g, input_precision=PRECISION)
            acc_u = tl.dot(a, wu, acc_u, input_precision=PRECISION)
            x_ptrs += BLOCK_K
            g_ptrs += BLOCK_K * stride_wk
            u_ptrs += BLOCK_K * stride_wk
        if HAS_BIAS:
            acc_g += tl.load(b_ptr + e * stride_be + gate_rows, mask=nmask, other=0.0).to(tl.float32)[None, :]
            acc_u += tl.load(b_ptr + e * stride_be + up_rows, mask=nmask, other=0.0).to(tl.float32)[None, :]
        if ACT == 0:  # silu(gate) * up
            h = acc_g * tl.sigmoid(acc_g) * acc_u
        else:  # gpt-oss: clamped gate and up, (up + 1) * gate * sigmoid(alpha * gate)
            if CLAMP:
                acc_g = tl.minimum(acc_g, swiglu_limit)
                acc_u = tl.minimum(tl.maximum(acc_u, -swiglu_limit), swiglu_limit)
            h = (acc_u + 1.0) * (acc_g * tl.sigmoid(swiglu_alpha * acc_g))
        h_ptrs = h_ptr + rows[:, None] * stride_ht + n[None, :]
        tl.store(h_ptrs, h.to(h_ptr.dtype.element_ty), mask=rmask[:, None] & nmask[None, :])


@triton.jit(do_not_specialize=MOE_VARYING)
def _moe_down_kernel(
    h_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    weights_ptr,
    sorted_ptr,
    block_expert_ptr,
    num_padded_ptr,
    num_rows,
    num_blocks_m,
    H,
    inter,
    stride_ht,  # h: [n, I], unit stride
    stride_we,
    stride_wn,
    stride_wk,  # w_down: [E, H, I]
    stride_be,  # b_down: [E, H], unit stride
    stride_yt,  # y: [n, H] fp32, unit stride; weights: [n] fp32
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    FP32: tl.constexpr,
    PRECISION: tl.constexpr,
):
    pid_m, pid_n = _block_of(tl.program_id(0), num_blocks_m, tl.cdiv(H, BLOCK_N), GROUP_M)
    if pid_m * BLOCK_M < tl.load(num_padded_ptr):
        rows = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        rmask = rows < num_rows
        e = tl.load(block_expert_ptr + pid_m).to(tl.int64)
        n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        nmask = n < H
        kk = tl.arange(0, BLOCK_K)
        a_ptrs = h_ptr + rows[:, None] * stride_ht + kk[None, :]
        w_ptrs = w_ptr + e * stride_we + n[None, :].to(tl.int64) * stride_wn + kk[:, None] * stride_wk
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, inter, BLOCK_K):
            kmask = kk < inter - k0
            a = tl.load(a_ptrs, mask=rmask[:, None] & kmask[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=kmask[:, None] & nmask[None, :], other=0.0)
            if FP32:
                a = a.to(tl.float32)
                w = w.to(tl.float32)
            acc = tl.dot(a, w, acc, input_precision=PRECISION)
            a_ptrs += BLOCK_K
            w_ptrs += BLOCK_K * stride_wk
        if HAS_BIAS:
            acc += tl.load(b_ptr + e * stride_be + n, mask=nmask, other=0.0).to(tl.float32)[None, :]
        acc *= tl.load(weights_ptr + rows, mask=rmask, other=0.0)[:, None]
        y_ptrs = y_ptr + rows[:, None] * stride_yt + n[None, :]
        tl.store(y_ptrs, acc, mask=rmask[:, None] & nmask[None, :])


def fused_moe(
    x: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    *,
    b_gate_up: torch.Tensor | None = None,
    b_down: torch.Tensor | None = None,
    activation: str = "silu",
    swiglu_limit: float = 0.0,
    swiglu_alpha: float = 1.702,
    interleaved_gate_up: bool = False,
    config: MoEConfig | None = None,
) -> torch.Tensor:
    """x [T, H]; w_gate_up [E, 2I, H]; w_down [E, H, I] (any strides: a transposed view of a
    checkpoint's [E, H, 2I] / [E, I, H] is read in place); topk_ids [T, k] int in [0, E) (not
    checked on the device); topk_weights [T, k] fp32; biases [E, 2I] and [E, H] or None. Returns
    [T, H] in x's dtype: sum_j topk_weights[t, j] * expert_{topk_ids[t, j]}(x[t]). Activations and
    layouts as moe_reference.fused_moe_reference; `config` overrides the tile choice (tests)."""
    check_moe_args(x, w_gate_up, w_down, topk_ids, topk_weights, b_gate_up, b_down, activation)
    T, H = x.shape
    E, two_i, _ = w_gate_up.shape
    inter = two_i // 2
    k = topk_ids.shape[1]
    n = T * k
    if n == 0:
        return torch.zeros_like(x)
    x = x if x.stride(1) == 1 else x.contiguous()
    cfg = config or choose_config(n, E)
    align = align_tokens(topk_ids, E, cfg.block_m)
    blocks_m = align.sorted_ids.numel() // cfg.block_m
    h = torch.empty(n, inter, dtype=x.dtype, device=x.device)
    y = torch.empty(n, H, dtype=torch.float32, device=x.device)
    fp32, precision = compute_in_fp32(x.dtype), dot_precision(x.dtype)
    b1 = None if b_gate_up is None else b_gate_up.contiguous()
    b2 = None if b_down is None else b_down.contiguous()
    _moe_gate_up_kernel[(blocks_m * triton.cdiv(inter, cfg.block_n),)](
        x,
        w_gate_up,
        b1,
        h,
        align.sorted_ids,
        align.block_expert,
        align.num_padded,
        n,
        blocks_m,
        H,
        inter,
        float(swiglu_limit),
        float(swiglu_alpha),
        x.stride(0),
        *w_gate_up.stride(),
        0 if b1 is None else b1.stride(0),
        h.stride(0),
        TOP_K=k,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        GROUP_M=cfg.group_m,
        INTERLEAVED=interleaved_gate_up,
        ACT=ACT_IDS[activation],
        CLAMP=activation == "swigluoai" and swiglu_limit > 0,
        HAS_BIAS=b1 is not None,
        FP32=fp32,
        PRECISION=precision,
        num_warps=cfg.num_warps,
    )
    _moe_down_kernel[(blocks_m * triton.cdiv(H, cfg.block_n),)](
        h,
        w_down,
        b2,
        y,
        topk_weights.reshape(-1).contiguous(),
        align.sorted_ids,
        align.block_expert,
        align.num_padded,
        n,
        blocks_m,
        H,
        inter,
        h.stride(0),
        *w_down.stride(),
        0 if b2 is None else b2.stride(0),
        y.stride(0),
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        GROUP_M=cfg.group_m,
        HAS_BIAS=b2 is not None,
        FP32=fp32,
        PRECISION=precision,
        num_warps=cfg.num_warps,
    )
    return y.view(T, k, H).sum(1).to(x.dtype)
