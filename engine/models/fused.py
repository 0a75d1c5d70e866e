"""The forward's elementwise operators, one object per model: fused C kernels on the CPU in fp32
(`csrc/fused_ops.c`, one call instead of four to six torch ops each) and RMSNorm and RoPE in bf16
(rounding where torch's ops round: bit for bit; docs/performance.md), torch ops elsewhere on the
host (fp16, no C compiler, EngineConfig.cpu_kernels=False); Triton kernels on CUDA
(engine/kernels/fused_ops.py)."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from engine import native

SOURCE = Path(__file__).parent / "csrc" / "fused_ops.c"
_P, _I, _L, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_float


def _library() -> ctypes.CDLL | None:
    norm_rope: dict[str, list[Any]] = {
        "add_rms_norm": [_P] * 4 + [_I, _I, _F, _I],
        "rope": [_P] * 4 + [_I] * 3 + [_L, _I],
    }
    return native.library(
        SOURCE,
        norm_rope
        | {f"{name}_bf16": a for name, a in norm_rope.items()}
        | {"silu_mul": [_P] * 2 + [_I] * 3, "argmax_f32": [_P, _P, _I, _L, _I]},
    )


def _sleef_expf16() -> int | None:
    """The address of torch's own 16-lane expf (Sleef_expf16_u10 in libtorch_cpu), which its bf16
    SiLU calls where torch runs its AVX-512 kernels; None elsewhere."""
    if torch.backends.cpu.get_cpu_capability() not in ("AVX512", "AVX512_BF16"):
        return None
    try:
        libtorch = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        return ctypes.cast(libtorch.Sleef_expf16_u10, ctypes.c_void_p).value
    except (OSError, AttributeError):
        return None


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """logits.argmax(dim=-1) for [S, V] logits: on the CPU in fp32 through `argmax_f32` (torch's
    picks, ties and NaN included, several times faster over a large vocabulary), else torch's."""
    lib = _library() if logits.device.type == "cpu" and logits.dtype == torch.float32 else None
    if lib is None or logits.dim() != 2 or not logits.is_contiguous() or 0 in logits.shape:
        return logits.argmax(dim=-1)
    R, V = logits.shape
    out = torch.empty(R, dtype=torch.int64)
    lib.argmax_f32(logits.data_ptr(), out.data_ptr(), R, V, torch.get_num_threads())
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Same arithmetic as transformers' LlamaRMSNorm: normalise in fp32, scale in the model dtype.
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def swap_halves(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((x[..., half:], x[..., :half]), dim=-1)


class TorchOps:
    """The operators as torch ops (any device and dtype)."""

    def add_rms_norm(
        self, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + delta, rms_norm(x + delta)); x: [T, C] the residual stream, delta None: nothing added."""
        if delta is not None:
            x = x + delta
        return x, rms_norm(x, weight, eps)

    def rope(
        self, qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """qk: [T, heads, D] (a view into the fused QKV output) rotated at positions [T]; returns
        the rotated tensor. cos, sin: [P, D], sin with its first half negated."""
        c, s = cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)  # [T, 1, D]
        return qk * c + swap_halves(qk) * s

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """[T, 2I] -> [T, I] silu(gate) * up."""
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up


class CPUOps(TorchOps):
    """The same operators in C, for contiguous fp32 CPU tensors, and RMSNorm and RoPE for bf16 ones
    (others take the torch path)."""

    SUFFIX = {torch.float32: "", torch.bfloat16: "_bf16"}  # the kernel of each dtype

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        self.sleef_expf16 = _sleef_expf16() if hasattr(lib, "silu_mul_bf16") else None
        if self.sleef_expf16 is not None:
            lib.silu_mul_bf16.restype = None
            lib.silu_mul_bf16.argtypes = [_P, _P, _I, _I, _P, _I]

    def _kernel(self, name: str, dtype: torch.dtype) -> Any:
        suffix = self.SUFFIX.get(dtype)
        return None if suffix is None else getattr(self.lib, name + suffix)

    def add_rms_norm(
        self, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        kernel = self._kernel("add_rms_norm", x.dtype)
        if (
            kernel is None
            or weight.dtype != x.dtype
            or not x.is_contiguous()
            or not weight.is_contiguous()
            or (delta is not None and (not delta.is_contiguous() or delta.dtype != x.dtype))
        ):
            return super().add_rms_norm(x, delta, weight, eps)
        T, C = x.shape
        out = torch.empty_like(x)
        kernel(
            x.data_ptr(),
            delta.data_ptr() if delta is not None else None,
            weight.data_ptr(),
            out.data_ptr(),
            T,
            C,
            eps,
            torch.get_num_threads(),
        )
        return x, out  # x updated in place

    def rope(
        self, qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        T, heads, D = qk.shape
        kernel = self._kernel("rope", qk.dtype)
        if (
            kernel is None
            or cos.dtype != qk.dtype
            or sin.dtype != qk.dtype
            or not (cos.is_contiguous() and sin.is_contiguous())
            or qk.stride(2) != 1
            or qk.stride(1) != D
            or positions.dtype != torch.int64
        ):
            return super().rope(qk, cos, sin, positions)
        kernel(
            qk.data_ptr(),
            positions.data_ptr(),
            cos.data_ptr(),
            sin.data_ptr(),
            T,
            heads,
            D,
            qk.stride(0),
            torch.get_num_threads(),
        )
        return qk  # rotated in place

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        # bf16: torch's arithmetic with torch's own expf (Sleef's, from libtorch: another expf's last
        # bits moved a bf16 result by an ulp now and then, and flipped near-tied greedy tokens)
        if (
            gate_up.dtype == torch.bfloat16
            and self.sleef_expf16 is not None
            and gate_up.dim() == 2
            and gate_up.is_contiguous()
            and gate_up.shape[1] % 32 == 0
        ):
            T, I2 = gate_up.shape
            out = torch.empty(T, I2 // 2, dtype=torch.bfloat16)
            self.lib.silu_mul_bf16(
                gate_up.data_ptr(), out.data_ptr(), T, I2 // 2, self.sleef_expf16, torch.get_num_threads()
            )
            return out
        if gate_up.dtype != torch.float32 or not gate_up.is_contiguous():
            return super().silu_mul(gate_up)
        T, I2 = gate_up.shape
        out = torch.empty(T, I2 // 2)
        self.lib.silu_mul(gate_up.data_ptr(), out.data_ptr(), T, I2 // 2, torch.get_num_threads())
        return out
