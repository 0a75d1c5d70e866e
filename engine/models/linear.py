"""Linear layers: fp32 on the CPU through an own C kernel, bf16 prepacked for oneDNN.

fp32 on CPU: `csrc/f32_linear.c`. The weight is packed once into panels of 16 (AVX2) or 32
(AVX-512) output channels, [ceil(N / NR), K, NR], and the kernel keeps a tile of up to 6 (8) rows
x NR channels in vector registers, one FMA chain per output over k: every panel is one sequential
stream (a decode step reads each weight once), no horizontal sums, and a row's result does not
depend on its batch. The panels are the only copy of the weight (`Linear.weight` unpacks one).
Measurements in docs/performance.md.
bf16 on CPU with AVX512-BF16 or AVX2 and the own kernels on: `csrc/bf16_linear.c` over panels
packed once (engine/models/bf16_linear.py); with AMX, calls of `ONEDNN_MIN_ROWS` to
`BF16Panels.amx_max_rows` rows run csrc/bf16_amx.c's AMX tiles over the same panels, and calls of
more rows a second, oneDNN-packed copy of the weight. Other bf16 on CPU: oneDNN's blocked weight
layout lets its AMX / AVX-512 kernels skip the per-call reorder that `F.linear` pays; on the 2-core Xeon we
measured 1.4x (batch 64) to 1.9x (LM head) faster matmuls with bit-identical results. Everywhere
else (GPU, no oneDNN, no C compiler) it is plain `F.linear`.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch
import torch.nn.functional as F

from engine import native
from engine.models.bf16_linear import BF16Panels, onednn_rows

PACK_BATCH_HINT = 64  # oneDNN picks its blocking for about this many rows; any row count works
SOURCE = Path(__file__).parent / "csrc" / "f32_linear.c"


def f32_library() -> ctypes.CDLL | None:
    """The fp32 C kernel, or None without a C compiler."""
    lib = native.library(
        SOURCE, {"f32_linear": [ctypes.c_void_p] * 4 + [ctypes.c_int] * 4, "f32_panel_width": []}
    )
    if lib is not None:
        lib.f32_panel_width.restype = ctypes.c_int
    return lib


def pack(lib: ctypes.CDLL, weight: torch.Tensor) -> torch.Tensor:
    """[N, K] fp32 rows -> the kernel's panels [ceil(N / NR), K, NR] (NR channels a panel, zero-padded)."""
    N, K = weight.shape
    nr = lib.f32_panel_width()
    panels = -(-N // nr)
    if panels * nr != N:
        weight = torch.cat([weight, weight.new_zeros(panels * nr - N, K)])
    return weight.view(panels, nr, K).transpose(1, 2).contiguous()


def unpack(packed: torch.Tensor, n: int) -> torch.Tensor:
    """`pack`'s inverse: the first n channels as [n, K] rows."""
    panels, K, nr = packed.shape
    return packed.transpose(1, 2).reshape(panels * nr, K)[:n]


def _can_pack(weight: torch.Tensor) -> bool:
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.bfloat16
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


def _onednn_pack(weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    """The weight in oneDNN's blocked layout, or None where oneDNN refuses it."""
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, PACK_BATCH_HINT)
        probe = torch.zeros(1, weight.shape[1], dtype=weight.dtype)
        torch.ops.mkldnn._linear_pointwise(probe, packed, bias, "none", [], "")
        return packed
    except RuntimeError:
        return None


class Linear:
    """y = x @ weight.T + bias. weight: [out, in]. `cpu_kernel`: allow the fp32 and bf16 C kernels
    (CPU), which keep the weight only in their panels (`weight` then unpacks a copy). `cpu_amx`
    (bf16 with the C kernel): also keep a oneDNN copy for calls of many rows, see
    `bf16_linear.onednn_rows` (None: where the CPU has AMX)."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        cpu_kernel: bool = True,
        cpu_amx: bool | None = None,
    ):
        self._weight: torch.Tensor | None = weight
        self.bias = bias
        self.packed = None
        self.lib = None
        self.panels: torch.Tensor | None = None
        self._bias: torch.Tensor | None = None
        self.bf16 = BF16Panels.make(weight, bias) if cpu_kernel else None  # AVX512-BF16 or AVX2 CPUs
        self.out_features = weight.shape[0]
        self.nbytes = weight.numel() * weight.element_size()  # the weight as stored (padding apart)
        if cpu_kernel and weight.device.type == "cpu" and weight.dtype == torch.float32 and weight.dim() == 2:
            self.lib = f32_library()
            if self.lib is not None:
                self.panels = pack(self.lib, weight.contiguous())
                self._weight = None  # the panels are the only copy
                self._bias = bias.contiguous() if bias is not None else None
        # with the bf16 C kernel: from how many rows oneDNN's copy takes the call (None: never)
        self.onednn_rows = onednn_rows(cpu_amx) if self.bf16 is not None else None
        if self.bf16 is not None:
            self._weight = None  # the panels are the only copy, but for oneDNN's below
        if (self.bf16 is None or self.onednn_rows is not None) and _can_pack(weight):
            self.packed = _onednn_pack(weight, bias)
        if self.bf16 is not None and self.packed is None:
            self.onednn_rows = None

    @property
    def has_cpu_kernel(self) -> bool:
        """Do calls run the fp32 C kernel (`kernel_weight` and `kernel_bias` are what it reads)?"""
        return self.lib is not None

    @property
    def kernel_weight(self) -> torch.Tensor:
        """The C kernel's weight: fp32 panels [ceil(out / NR), in, NR] (see `pack`)."""
        if self.panels is None:
            raise ValueError("this layer does not run the fp32 C kernel")
        return self.panels

    @property
    def kernel_bias(self) -> torch.Tensor | None:
        """The C kernel's bias: fp32 [out], contiguous, or None."""
        return self._bias

    @property
    def weight(self) -> torch.Tensor:
        """[out, in]; with a C kernel, a copy unpacked from its panels."""
        if self._weight is not None:
            return self._weight
        return self.bf16.weight if self.bf16 is not None else unpack(self.kernel_weight, self.out_features)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.lib is not None and x.dim() == 2 and x.shape[0] > 0 and x.dtype == torch.float32:
            x = x.contiguous()
            M, K = x.shape
            y = torch.empty(M, self.out_features)
            self.lib.f32_linear(
                x.data_ptr(),
                self.kernel_weight.data_ptr(),
                self._bias.data_ptr() if self._bias is not None else None,
                y.data_ptr(),
                M,
                self.out_features,
                K,
                torch.get_num_threads(),
            )
            return y
        if self.bf16 is not None and x.dim() == 2 and x.shape[0] > 0 and x.dtype == torch.bfloat16:
            if self.onednn_rows is None or x.shape[0] < self.onednn_rows:
                return self.bf16(x)
            if x.shape[0] <= self.bf16.amx_max_rows:
                return self.bf16.run(x, amx=True)
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)
