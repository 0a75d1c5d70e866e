"""Segmented LoRA in Triton (the GPU path), SGMV-style (Punica / S-LoRA): one launch "shrinks"
every segment's rows to their adapter's rank, a second "expands" them back and adds to y.

    shrink: xa[t, k]  = sum_i x[t, i] * a[slot, k, i]     k < rank*m   a viewed [S, R*m, in]
    expand: y[t, n]  += sum_k xa[t, k] * b[slot, k, n]                 b viewed [S, R*m, out]

Each program reads its segment's start, end, slot and rank, so segments of different adapters and
ranks run in the same launch and rows of no segment are never touched; programs past their
segment's rows or rank return at once.

Split-K: a decode step's shrink is a few rows against up to 14,336 inputs, a handful of tiles for
132 SMs. Its grid has a dimension over K chunks (`shrink_plan`: enough chunks for about two waves
of programs, none under MIN_CHUNK inputs); each chunk writes its partial sums to its own fp32
plane and the planes are summed in a fixed order (a torch sum), so results are deterministic.

Precision (`_dot`): a fp32 model's dots are IEEE fp32 (exact to fp32 rounding). A bf16 or fp16
model's dots run on the tensor cores in that dtype with fp32 accumulation. The engine keeps
adapters in fp32 (PEFT's arithmetic, docs/lora.md) and the rank-r intermediate is fp32: an fp32
operand is split into three terms of the model's dtype, v = hi + mid / S + lo / S^2 (S = 2^(its
mantissa bits + 1)), and the products down to 1/S^2 are summed (3 MMAs a tile in the shrink, 6 in
the expand), which keeps the fp32 operands to about 2^-24: the result is the fp32 dot's up to
summation order, and y + delta is rounded to the model's dtype once on store. Adapters already in
the model's dtype take one MMA. Triton's interpreter gets bf16 dots wrong, so there (EMULATE) the
same bf16/fp16 operands are upcast for the dot: the products are exact either way.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from engine.device import host_to_device
from engine.lora.kernels.base import LoRAKernel, Segment

BLOCK_M = 16  # rows of a program
SHRINK_BLOCK_K = 64  # inputs per step of the shrink's reduction
EXPAND_BLOCK_N = 64  # output columns of an expand program
EXPAND_BLOCK_K = 16  # rank columns per step of the expand's reduction
MIN_CHUNK = 64  # fewest inputs a shrink program reduces over (one step)
MAX_SPLITS = 256
H100_SMS = 132  # where no GPU is queried (the interpreter, offline compiles)
EMULATE = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _mma(p, q, acc, EMULATE: tl.constexpr):
    """acc + p @ q for tiles of one 16-bit dtype: an MMA with fp32 accumulation."""
    if EMULATE:
        acc = tl.dot(p.to(tl.float32), q.to(tl.float32), acc, input_precision="ieee")
    else:
        acc = tl.dot(p, q, acc)
    return acc


@triton.jit
def _round(v, T: tl.constexpr, EMULATE: tl.constexpr):
    """fp32 v rounded to the nearest value of T (ties to even). In the interpreter a bf16 result
    is kept in fp32 and rounded by bits: its fp32 -> bf16 conversion drops the carry out of the
    mantissa (1.99999 becomes 1.0)."""
    if EMULATE and T == tl.bfloat16:
        bits = v.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        r = bits.to(tl.float32, bitcast=True)
    else:
        r = v.to(T, fp_downcast_rounding="rtne")
    return r


@triton.jit
def _split(v, T: tl.constexpr, S: tl.constexpr, EMULATE: tl.constexpr):
    """fp32 v as hi + mid / S + lo / S^2, three values of T: v to within 2^-24 of |v|."""
    hi = _round(v, T, EMULATE)
    rest = (v - hi.to(tl.float32)) * S
    mid = _round(rest, T, EMULATE)
    lo = _round((rest - mid.to(tl.float32)) * S, T, EMULATE)
    return hi, mid, lo


@triton.jit
def _dot(p, q, acc, T: tl.constexpr, EMULATE: tl.constexpr):
    """acc + p @ q with fp32 accumulation in the model's dtype T (see the module docstring): fp32,
    IEEE; bf16/fp16, MMAs in T, an fp32 operand split in three terms and the products down to
    1/S^2 taken (3 MMAs for one fp32 operand, 6 for two, 1 for none)."""
    zero = tl.zeros(acc.shape, tl.float32)
    S: tl.constexpr = 256.0 if T == tl.bfloat16 else 2048.0  # 2^(mantissa bits + 1)
    if T == tl.float32:
        acc = tl.dot(p.to(tl.float32), q.to(tl.float32), acc, input_precision="ieee")
    elif p.dtype == T and q.dtype == T:
        acc = _mma(p, q, acc, EMULATE)
    elif p.dtype == T:
        q_hi, q_mid, q_lo = _split(q, T, S, EMULATE)
        acc = _mma(p, q_hi, acc, EMULATE)
        small = _mma(p, q_mid, _mma(p, q_lo, zero, EMULATE) / S, EMULATE)
        acc += small / S
    elif q.dtype == T:
        p_hi, p_mid, p_lo = _split(p, T, S, EMULATE)
        acc = _mma(p_hi, q, acc, EMULATE)
        small = _mma(p_mid, q, _mma(p_lo, q, zero, EMULATE) / S, EMULATE)
        acc += small / S
    else:
        p_hi, p_mid, p_lo = _split(p, T, S, EMULATE)
        q_hi, q_mid, q_lo = _split(q, T, S, EMULATE)
        acc = _mma(p_hi, q_hi, acc, EMULATE)
        least = _mma(p_lo, q_hi, _mma(p_mid, q_mid, _mma(p_hi, q_lo, zero, EMULATE), EMULATE), EMULATE)
        small = _mma(p_mid, q_hi, _mma(p_hi, q_mid, least / S, EMULATE), EMULATE)
        acc += small / S
    return acc


# M: 1 for o/down, 2 or 3 fused; NCB: from the step's largest rank; stride_xs: rows x R*M
@triton.jit(do_not_specialize=["M", "NCB", "stride_xs"])
def _shrink(
    x_ptr,
    a_ptr,
    xa_ptr,
    starts,
    ends,
    slots,
    ranks,
    M,
    IN,
    NCB,  # column blocks (grid axis 0 is K chunk x column block)
    CHUNK,  # inputs of a K chunk, a multiple of BLOCK_K
    stride_x,
    stride_as,
    stride_ak,
    stride_xs,  # between the K chunks' planes of xa
    stride_xa,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EMULATE: tl.constexpr,
):
    pid, pid_m, seg = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    pid_n, split = pid % NCB, pid // NCB
    start, end = tl.load(starts + seg), tl.load(ends + seg)
    K = tl.load(ranks + seg) * M  # this segment's r*m
    if (start + pid_m * BLOCK_M >= end) | (pid_n * BLOCK_N >= K):
        return
    slot = tl.load(slots + seg).to(tl.int64)
    rows = start + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_first = split * CHUNK
    for k0 in range(k_first, k_first + CHUNK, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        xt = tl.load(
            x_ptr + rows[:, None] * stride_x + ks[None, :],
            mask=(rows[:, None] < end) & (ks[None, :] < IN),
            other=0.0,
        )  # [BM, BK]
        at = tl.load(
            a_ptr + slot * stride_as + cols[None, :] * stride_ak + ks[:, None],
            mask=(cols[None, :] < K) & (ks[:, None] < IN),
            other=0.0,
        )  # [BK, BN]
        acc = _dot(xt, at, acc, x_ptr.dtype.element_ty, EMULATE)
    tl.store(
        xa_ptr + split.to(tl.int64) * stride_xs + rows[:, None] * stride_xa + cols[None, :],
        acc,
        mask=(rows[:, None] < end) & (cols[None, :] < K),
    )


@triton.jit(do_not_specialize=["M", "KMAX"])  # KMAX: the step's largest rank x M
def _expand(
    xa_ptr,
    b_ptr,
    y_ptr,
    starts,
    ends,
    slots,
    ranks,
    M,
    OUT,
    KMAX,
    stride_xa,
    stride_bs,
    stride_bk,
    stride_y,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EMULATE: tl.constexpr,
):
    pid_n, pid_m, seg = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    start, end = tl.load(starts + seg), tl.load(ends + seg)
    if start + pid_m * BLOCK_M >= end:
        return
    slot, K = tl.load(slots + seg).to(tl.int64), tl.load(ranks + seg) * M
    rows = start + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, KMAX, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        xat = tl.load(
            xa_ptr + rows[:, None] * stride_xa + ks[None, :],
            mask=(rows[:, None] < end) & (ks[None, :] < K),
            other=0.0,
        )  # [BM, BK] fp32
        bt = tl.load(
            b_ptr + slot * stride_bs + ks[:, None] * stride_bk + cols[None, :],
            mask=(ks[:, None] < K) & (cols[None, :] < OUT),
            other=0.0,
        )  # [BK, BN]
        acc = _dot(xat, bt, acc, y_ptr.dtype.element_ty, EMULATE)
    mask = (rows[:, None] < end) & (cols[None, :] < OUT)
    ptrs = y_ptr + rows[:, None] * stride_y + cols[None, :]
    y = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(ptrs, (y + acc).to(y_ptr.dtype.element_ty), mask=mask)


def shrink_plan(in_features: int, tiles: int, sms: int = H100_SMS) -> tuple[int, int]:
    """(K chunks, inputs a chunk) for a shrink of `tiles` row x column tiles: about two waves of
    programs on `sms` SMs, no chunk under MIN_CHUNK inputs, each a multiple of SHRINK_BLOCK_K."""
    splits = max(1, min(triton.cdiv(2 * sms, tiles), in_features // MIN_CHUNK, MAX_SPLITS))
    chunk = triton.cdiv(triton.cdiv(in_features, splits), SHRINK_BLOCK_K) * SHRINK_BLOCK_K
    return triton.cdiv(in_features, chunk), chunk


@functools.cache
def _sms(device: torch.device) -> int:
    if device.type != "cuda":
        return H100_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


@dataclass
class SegmentTensors:
    starts: torch.Tensor  # [G] int32, on the device
    ends: torch.Tensor
    slots: torch.Tensor
    ranks: torch.Tensor
    max_rows: int  # the longest segment (grid size)
    max_rank: int


class TritonSGMV(LoRAKernel):
    name = "triton"
    supports_graphs = True  # grid from max_rows, max_rank and the table's width (graph.py)

    def prepare(self, segments: list[Segment], device: torch.device) -> SegmentTensors:
        # [4, G] padded to G a multiple of 4: each row starts 16-byte aligned, as Triton specialises
        # pointers on (else the segment count would pick the compiled variant)
        table = torch.zeros(4, triton.cdiv(len(segments), 4) * 4, dtype=torch.int32)
        table[:, : len(segments)] = torch.tensor([list(s) for s in segments], dtype=torch.int32).T
        cols = host_to_device(table, device)[:, : len(segments)]
        return SegmentTensors(
            cols[0],
            cols[1],
            cols[2],
            cols[3],
            max(s.end - s.start for s in segments),
            max(s.rank for s in segments),
        )

    def apply(
        self, y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, meta: SegmentTensors
    ) -> None:
        S, R, M, IN = a.shape
        OUT = b.shape[-1]
        assert x.stride(1) == 1 and y.stride(1) == 1 and a.is_contiguous() and b.is_contiguous()
        K = meta.max_rank * M
        a2, b2 = a.view(S, R * M, IN), b.view(S, R * M, OUT)
        G = meta.starts.numel()
        row_blocks = triton.cdiv(meta.max_rows, BLOCK_M)
        # columns of a shrink program: the slots' R*M (fixed per projection: one variant), 16..64
        block_n = min(64, max(16, triton.next_power_of_2(R * M)))
        ncb = triton.cdiv(K, block_n)
        splits, chunk = shrink_plan(IN, G * row_blocks * ncb, _sms(x.device))
        # [splits, T, R*M] (R*M: one row stride a projection, whatever the step's ranks); the rows of
        # no segment and the columns past a segment's rank stay unwritten, and the expand masks them
        part = torch.empty(splits, x.shape[0], R * M, dtype=torch.float32, device=x.device)
        _shrink[(splits * ncb, row_blocks, G)](
            x,
            a2,
            part,
            meta.starts,
            meta.ends,
            meta.slots,
            meta.ranks,
            M,
            IN,
            ncb,
            chunk,
            x.stride(0),
            a2.stride(0),
            a2.stride(1),
            part.stride(0),
            part.stride(1),
            BLOCK_M=BLOCK_M,
            BLOCK_N=block_n,
            BLOCK_K=SHRINK_BLOCK_K,
            EMULATE=EMULATE,
            num_warps=2 if block_n <= 32 else 4,  # 4 spill in fp16 at 16 columns (ptxas, sm_90a)
        )
        xa = part[0] if splits == 1 else part.sum(0)  # [T, r*m] fp32, the chunks in a fixed order
        _expand[(triton.cdiv(OUT, EXPAND_BLOCK_N), row_blocks, G)](
            xa,
            b2,
            y,
            meta.starts,
            meta.ends,
            meta.slots,
            meta.ranks,
            M,
            OUT,
            K,
            xa.stride(0),
            b2.stride(0),
            b2.stride(1),
            y.stride(0),
            BLOCK_M=BLOCK_M,
            BLOCK_N=EXPAND_BLOCK_N,
            BLOCK_K=EXPAND_BLOCK_K,
            EMULATE=EMULATE,
        )
