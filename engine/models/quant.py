"""Weight-only INT8 quantization (EngineConfig.quantization = "int8").

Each linear layer's weight is stored as int8 with one fp32 scale per output channel (symmetric:
scale = max |w| / 127 over the row), a quarter of fp32's bytes. Activations stay in the model's
dtype. On CPU every call runs `csrc/int8_linear.c`, which reads the int8 rows and converts them in
registers (a bandwidth-bound decode reads a quarter of the bytes; a weight is never stored
dequantized). On other devices, and without a C compiler, the weight is dequantized for the call
and the dense matmul runs.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import torch
import torch.nn.functional as F

from engine import native

QUANTIZATIONS = (None, "int8")
SOURCE = Path(__file__).parent / "csrc" / "int8_linear.c"


def _library() -> ctypes.CDLL | None:
    """The C kernel, or None without a C compiler (the dequantizing path then serves every call)."""
    return native.library(SOURCE, {"int8_linear_f32": [ctypes.c_void_p] * 5 + [ctypes.c_int] * 4})


def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] float -> (int8 [N, K], fp32 scales [N]), symmetric per output channel."""
    w = weight.float()
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q.contiguous(), scale.contiguous()


class Int8Linear:
    """y = x @ (q * scale).T + bias, with the Linear interface (engine/models/linear.py)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        self.dtype = weight.dtype
        self.qweight, self.scale = quantize(weight)
        self.bias = bias
        self._bias32 = bias.float().contiguous() if bias is not None else None
        self.lib = _library() if weight.device.type == "cpu" else None

    @property
    def weight(self) -> torch.Tensor:
        """The dequantized weight (model dtype): what every row is multiplied by."""
        return (self.qweight.float() * self.scale[:, None]).to(self.dtype)

    @property
    def nbytes(self) -> int:
        return self.qweight.numel() + 4 * self.scale.numel()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        M = x.shape[0]
        if self.lib is not None and x.dim() == 2 and M > 0 and x.device.type == "cpu":
            x32 = x.float().contiguous()
            N, K = self.qweight.shape
            y = torch.empty(M, N, dtype=torch.float32)
            self.lib.int8_linear_f32(x32.data_ptr(), self.qweight.data_ptr(), self.scale.data_ptr(),
                                     self._bias32.data_ptr() if self._bias32 is not None else None,
                                     y.data_ptr(), M, N, K, torch.get_num_threads())
            return y if x.dtype == torch.float32 else y.to(x.dtype)
        return F.linear(x, self.weight, self.bias)
