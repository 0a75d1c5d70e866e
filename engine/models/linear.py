"""Linear layers: fp32 on the CPU through an own C kernel at small batch, bf16 prepacked for oneDNN.

fp32 on CPU: `csrc/f32_linear.c` (AVX-512 or AVX2 FMA register tiles over the checkpoint's
[out, in] rows, both threads): a decode step reads each weight once at close to the memory
bandwidth, where torch's sgemv reached about a third of it on the 2-core EPYC, and batches of 32 to
2048 rows ran 1.4x to 2.5x faster than torch's sgemm there (docs/performance.md).
bf16 on CPU: oneDNN's blocked weight layout lets its AMX / AVX-512 kernels skip the per-call
reorder that `F.linear` pays; on the 2-core Xeon we measured 1.4x (batch 64) to 1.9x (LM head)
faster matmuls with bit-identical results. Everywhere else (GPU, no oneDNN, no C compiler) it is
plain `F.linear`.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import torch
import torch.nn.functional as F

from engine import native

PACK_BATCH_HINT = 64  # oneDNN picks its blocking for about this many rows; any row count works
SOURCE = Path(__file__).parent / "csrc" / "f32_linear.c"


def f32_library() -> ctypes.CDLL | None:
    """The fp32 C kernel, or None without a C compiler."""
    return native.library(SOURCE, {"f32_linear": [ctypes.c_void_p] * 4 + [ctypes.c_int] * 4})


def _can_pack(weight: torch.Tensor) -> bool:
    return (weight.device.type == "cpu" and weight.dtype == torch.bfloat16
            and torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


class Linear:
    """y = x @ weight.T + bias. weight: [out, in]. `cpu_kernel`: allow the fp32 C kernel (CPU)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, cpu_kernel: bool = True):
        self.weight = weight
        self.bias = bias
        self.packed = None
        self.lib = None
        if cpu_kernel and weight.device.type == "cpu" and weight.dtype == torch.float32 and weight.is_contiguous():
            self.lib = f32_library()
            self._bias = bias.contiguous() if bias is not None else None
        if _can_pack(weight):
            try:
                packed = torch.ops.mkldnn._reorder_linear_weight(weight, PACK_BATCH_HINT)
                probe = torch.zeros(1, weight.shape[1], dtype=weight.dtype)
                torch.ops.mkldnn._linear_pointwise(probe, packed, bias, "none", [], "")
                self.packed = packed
            except RuntimeError:
                self.packed = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.lib is not None and x.dim() == 2 and x.shape[0] > 0 and x.dtype == torch.float32:
            x = x.contiguous()
            M, (N, K) = x.shape[0], self.weight.shape
            y = torch.empty(M, N)
            self.lib.f32_linear(x.data_ptr(), self.weight.data_ptr(),
                                self._bias.data_ptr() if self._bias is not None else None,
                                y.data_ptr(), M, N, K, torch.get_num_threads())
            return y
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)
