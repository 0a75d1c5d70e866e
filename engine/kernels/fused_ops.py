"""The forward's elementwise operators as Triton kernels (the GPU path): residual add + RMSNorm,
RoPE on q and k together, and SiLU(gate) * up, one launch each instead of four to eight torch
kernels. Same arithmetic as engine/models/fused.py's TorchOps: RMSNorm normalises in fp32 and
scales in the model dtype, as transformers' LlamaRMSNorm; RoPE is x * cos + swap_halves(x) * sin
with the first half of sin negated, computed in fp32 and rounded once; SiLU in fp32.

Grids are over rows (tokens), the first axis, so any batch fits; the row width is a constexpr
padded to a power of two. Row counts never reach the kernels as specialised ints.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.common import next_pow2
from engine.models.fused import TorchOps


def _warps(width: int) -> int:
    return 8 if width >= 4096 else 4


@triton.jit(do_not_specialize=["eps"])
def _add_rms_norm_kernel(
    x_ptr,
    delta_ptr,
    w_ptr,
    out_ptr,
    eps,
    C,
    HAS_DELTA: tl.constexpr,
    BLOCK: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK)
    mask = c < C
    x = tl.load(x_ptr + t * C + c, mask=mask, other=0.0)
    if HAS_DELTA:
        x = (x.to(tl.float32) + tl.load(delta_ptr + t * C + c, mask=mask, other=0.0).to(tl.float32)).to(
            x_ptr.dtype.element_ty
        )  # the residual stream keeps the model dtype, as `x + delta` in torch
        tl.store(x_ptr + t * C + c, x, mask=mask)
    h = x.to(tl.float32)
    h = h * tl.rsqrt(tl.sum(h * h, 0) / C + eps)
    w = tl.load(w_ptr + c, mask=mask, other=0.0).to(tl.float32)
    y = (w * h.to(x_ptr.dtype.element_ty).to(tl.float32)).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + t * C + c, y, mask=mask)


@triton.jit
def _rope_kernel(
    qk_ptr,
    pos_ptr,
    cos_ptr,
    sin_ptr,
    stride_t,
    HEADS: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    D: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    half: tl.constexpr = D // 2
    p = tl.load(pos_ptr + t).to(tl.int64)
    h = tl.arange(0, HEADS_PAD)[:, None]
    d = tl.arange(0, half)[None, :]
    mask = h < HEADS
    base = qk_ptr + t * stride_t + h * D + d
    a = tl.load(base, mask=mask, other=0.0).to(tl.float32)  # first halves [HEADS_PAD, D/2]
    b = tl.load(base + half, mask=mask, other=0.0).to(tl.float32)
    ca = tl.load(cos_ptr + p * D + d).to(tl.float32)
    cb = tl.load(cos_ptr + p * D + half + d).to(tl.float32)
    sa = tl.load(sin_ptr + p * D + d).to(tl.float32)  # already negated
    sb = tl.load(sin_ptr + p * D + half + d).to(tl.float32)
    dt = qk_ptr.dtype.element_ty
    # torch rounds each product and the sum to the model dtype; the same here
    ra = ((a * ca).to(dt).to(tl.float32) + (b * sa).to(dt).to(tl.float32)).to(dt)
    rb = ((b * cb).to(dt).to(tl.float32) + (a * sb).to(dt).to(tl.float32)).to(dt)
    tl.store(base, ra, mask=mask)
    tl.store(base + half, rb, mask=mask)


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, INTER, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = c < INTER
    g = tl.load(gu_ptr + t * 2 * INTER + c, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + t * 2 * INTER + INTER + c, mask=mask, other=0.0)
    dt = out_ptr.dtype.element_ty
    s = (g / (1.0 + tl.exp(-g))).to(dt)  # F.silu rounds to the model dtype before the product
    tl.store(out_ptr + t * INTER + c, (s.to(tl.float32) * u.to(tl.float32)).to(dt), mask=mask)


SILU_BLOCK = 1024


class TritonOps(TorchOps):
    """The operators as one Triton kernel each, for contiguous rows (others: the torch ops)."""

    def add_rms_norm(
        self, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not x.is_contiguous() or (delta is not None and not delta.is_contiguous()):
            return super().add_rms_norm(x, delta, weight, eps)
        T, C = x.shape
        out = torch.empty_like(x)
        if T:
            block = next_pow2(C)
            _add_rms_norm_kernel[(T,)](
                x,
                delta if delta is not None else x,
                weight,
                out,
                eps,
                C,
                HAS_DELTA=delta is not None,
                BLOCK=block,
                num_warps=_warps(block),
            )
        return x, out  # x updated in place

    def rope(
        self, qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        T, heads, D = qk.shape
        if qk.stride(2) != 1 or qk.stride(1) != D or not cos.is_contiguous() or not sin.is_contiguous():
            return super().rope(qk, cos, sin, positions)
        if T:
            _rope_kernel[(T,)](
                qk, positions, cos, sin, qk.stride(0), HEADS=heads, HEADS_PAD=next_pow2(heads), D=D
            )
        return qk  # rotated in place

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        if not gate_up.is_contiguous():
            return super().silu_mul(gate_up)
        T, I2 = gate_up.shape
        out = torch.empty(T, I2 // 2, dtype=gate_up.dtype, device=gate_up.device)
        if T:
            _silu_mul_kernel[(T, triton.cdiv(I2 // 2, SILU_BLOCK))](gate_up, out, I2 // 2, BLOCK=SILU_BLOCK)
        return out
