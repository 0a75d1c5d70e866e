"""Segmented LoRA in Triton (the GPU path), SGMV-style (Punica / S-LoRA): one launch "shrinks"
every segment's rows to their adapter's rank, a second "expands" them back and adds to y.

    shrink: xa[t, k]  = sum_i x[t, i] * a[slot, k, i]     k < rank*m   a viewed [S, R*m, in]
    expand: y[t, n]  += sum_k xa[t, k] * b[slot, k, n]                 b viewed [S, R*m, out]

The grid is (segment, row block, column block); each program reads its segment's start, end,
slot and rank, so segments of different adapters and ranks run in the same launch and rows of
no segment are never touched. Loads are upcast to fp32 (bf16/fp16 activations; the engine keeps
adapters in fp32), the dots are IEEE fp32 (not TF32), the rank-r intermediate stays fp32, and
y + delta is summed in fp32 and rounded to y's dtype once on store: PEFT's arithmetic, as in the
torch kernel. Tested on CPU in Triton's interpreter (tests/engine/lora/test_lora_triton.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from engine.device import host_to_device
from engine.lora.kernels.base import LoRAKernel, Segment

BLOCK_M = 16  # rows of a program
BLOCK_N = 32  # output columns of a program
BLOCK_K = 32  # reduction step


@triton.jit(do_not_specialize=["M"])  # 1 for o/down, 2 or 3 for the fused projections
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
    stride_x,
    stride_as,
    stride_ak,
    stride_xa,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    seg, pid_m, pid_n = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    start, end = tl.load(starts + seg), tl.load(ends + seg)
    slot, K = tl.load(slots + seg).to(tl.int64), tl.load(ranks + seg) * M  # this segment's r*m
    rows = start + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, IN, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        xt = tl.load(
            x_ptr + rows[:, None] * stride_x + ks[None, :],
            mask=(rows[:, None] < end) & (ks[None, :] < IN),
            other=0.0,
        ).to(tl.float32)  # [BM, BK]
        at = tl.load(
            a_ptr + slot * stride_as + cols[None, :] * stride_ak + ks[:, None],
            mask=(cols[None, :] < K) & (ks[:, None] < IN),
            other=0.0,
        ).to(tl.float32)  # [BK, BN]
        acc += tl.dot(xt, at, input_precision="ieee")
    tl.store(
        xa_ptr + rows[:, None] * stride_xa + cols[None, :],
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
):
    seg, pid_m, pid_n = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    start, end = tl.load(starts + seg), tl.load(ends + seg)
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
        ).to(tl.float32)  # [BM, BK]
        bt = tl.load(
            b_ptr + slot * stride_bs + ks[:, None] * stride_bk + cols[None, :],
            mask=(ks[:, None] < K) & (cols[None, :] < OUT),
            other=0.0,
        ).to(tl.float32)  # [BK, BN]
        acc += tl.dot(xat, bt, input_precision="ieee")
    mask = (rows[:, None] < end) & (cols[None, :] < OUT)
    ptrs = y_ptr + rows[:, None] * stride_y + cols[None, :]
    y = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(ptrs, (y + acc).to(y_ptr.dtype.element_ty), mask=mask)


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

    def prepare(self, segments: list[Segment], device: torch.device) -> SegmentTensors:
        cols = host_to_device(
            torch.tensor([list(s) for s in segments], dtype=torch.int32).T.contiguous(), device
        )
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
        xa = torch.empty(
            x.shape[0], K, dtype=torch.float32, device=x.device
        )  # [T, r*m]; rows of no segment unused
        G = meta.starts.numel()
        row_blocks = triton.cdiv(meta.max_rows, BLOCK_M)
        _shrink[(G, row_blocks, triton.cdiv(K, BLOCK_N))](
            x,
            a2,
            xa,
            meta.starts,
            meta.ends,
            meta.slots,
            meta.ranks,
            M,
            IN,
            x.stride(0),
            a2.stride(0),
            a2.stride(1),
            xa.stride(0),
            BLOCK_M=BLOCK_M,
            BLOCK_N=BLOCK_N,
            BLOCK_K=BLOCK_K,
        )
        _expand[(G, row_blocks, triton.cdiv(OUT, BLOCK_N))](
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
            BLOCK_N=BLOCK_N,
            BLOCK_K=BLOCK_K,
        )
