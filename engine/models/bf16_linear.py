"""bf16 linears on CPUs with AVX512-BF16 (`vdpbf16ps`) or AVX2: `csrc/bf16_linear.c`.

The weight is packed once, at load, into panels of 32 output channels with pairs of k side by
side, [ceil(N / 32), K / 2, 32, 2]: per pair of k the kernel loads the panel's 64 weights and adds
x[k] w[n, k] + x[k+1] w[n, k+1] into fp32 sums (one instruction per 16 channels and row), then
rounds each output to bf16 once, as torch's bf16 matmul does. Where the CPU has AVX2 and FMA but
not AVX512-BF16 the same panels run an AVX2 micro-kernel that widens each weight to fp32 as it
loads it (the same sums of exact products, fp32 FMAs). The panels are the only copy of the weight.
Without either, without a C compiler, or when K is odd, `BF16Panels.make` answers None and the
layer keeps torch's matmul.

On CPUs with AMX (Intel Sapphire Rapids and later) AMX tiles outrun this kernel from a few rows on
(measured on a 2-core Xeon with AMX, SmolLM2's shapes, oneDNN time over the C kernel's: 1.1-1.4 at
1 row, 0.7 at 4 rows, 0.25 at 16, 0.11-0.15 at 64), so there `ONEDNN_MIN_ROWS` picks: the C kernel
below it (decode of a few rows); from it to `AMX_MAX_ROWS` rows `csrc/bf16_amx.c`'s AMX kernel over
the same panels (batched decodes: one pass over the weight for up to 32 rows, no per-call
overhead to speak of; benchmarks/bf16_linear.py), up to `AMX_MAX_ROWS_NARROW` where the weight has
at most twice as many outputs as inputs (two passes of 32 rows, the second from cache: faster than
oneDNN there, slower on SmolLM2's gate_up and LM head); above it (prefill chunks) oneDNN's AMX kernels,
over a second, oneDNN-packed copy of the weight. `EngineConfig.cpu_amx` forces either way (True on a
CPU without AMX: oneDNN from `ONEDNN_MIN_ROWS` rows on).
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from engine import native

SOURCE = Path(__file__).parent / "csrc" / "bf16_linear.c"
ONEDNN_MIN_ROWS = 3  # with AMX, bf16 linears of at least this many rows run on AMX tiles
AMX_MAX_ROWS = 32  # ... in bf16_amx.c up to this many rows (one pass of 2 x 2 tiles), above in oneDNN
AMX_MAX_ROWS_NARROW = 64  # ... or up to this many where out_features <= 2 in_features (two passes)


@functools.cache
def cpu_has_amx_bf16() -> bool:
    """Does this CPU have AMX tiles for bf16 (Linux reports `amx_bf16` among the CPU flags)?"""
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " amx_bf16" in line for line in f)
    except OSError:
        return False


def onednn_rows(cpu_amx: bool | None) -> int | None:
    """From how many rows a bf16 linear with the C kernel hands its rows to oneDNN instead: with
    AMX (`cpu_amx` None: where the CPU has it; True: on any CPU, oneDNN then runs without AMX),
    `ONEDNN_MIN_ROWS`; None (never) without."""
    use = cpu_has_amx_bf16() if cpu_amx is None else cpu_amx
    return ONEDNN_MIN_ROWS if use and torch.backends.mkldnn.is_available() else None


def bf16_library() -> ctypes.CDLL | None:
    """The bf16 C kernel where the CPU runs it (AVX512-BF16, or AVX2 and FMA), else None."""
    lib = native.library(
        SOURCE,
        {
            "bf16_linear": [ctypes.c_void_p] * 4 + [ctypes.c_int] * 4,
            "bf16_amx_linear": [ctypes.c_void_p] * 4 + [ctypes.c_int] * 4,
            "bf16_panel_width": [],
            "bf16_linear_available": [],
            "bf16_amx_available": [],
        },
    )
    if lib is None:
        return None
    lib.bf16_panel_width.restype = lib.bf16_linear_available.restype = ctypes.c_int
    lib.bf16_amx_available.restype = ctypes.c_int
    return lib if lib.bf16_linear_available() else None


def pack(weight: torch.Tensor, nr: int = 32) -> torch.Tensor:
    """[N, K] bf16 rows (K even) -> panels [ceil(N / nr), K / 2, nr, 2], zero-padded channels."""
    N, K = weight.shape
    panels = -(-N // nr)
    if panels * nr != N:
        weight = torch.cat([weight, weight.new_zeros(panels * nr - N, K)])
    return weight.reshape(panels, nr, K // 2, 2).transpose(1, 2).contiguous()


def unpack(packed: torch.Tensor, n: int) -> torch.Tensor:
    """`pack`'s inverse: the first n channels as [n, K] rows."""
    panels, half, nr, _ = packed.shape
    return packed.transpose(1, 2).reshape(panels * nr, 2 * half)[:n]


class BF16Panels:
    """One bf16 weight in the kernel's panels: y = x @ weight.T + bias for bf16 x [M, K]."""

    def __init__(self, lib: ctypes.CDLL, weight: torch.Tensor, bias: torch.Tensor | None):
        self.lib, self.out_features = lib, weight.shape[0]
        self.panels = pack(weight.contiguous(), lib.bf16_panel_width())
        self.bias = bias.contiguous() if bias is not None else None

    @staticmethod
    def make(weight: torch.Tensor, bias: torch.Tensor | None) -> BF16Panels | None:
        if not (weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and weight.dim() == 2):
            return None
        if weight.shape[1] % 2 or (bias is not None and bias.dtype != torch.bfloat16):
            return None
        lib = bf16_library()
        return BF16Panels(lib, weight, bias) if lib is not None else None

    @property
    def weight(self) -> torch.Tensor:
        return unpack(self.panels, self.out_features)

    @functools.cached_property
    def amx(self) -> bool:
        """Does bf16_amx.c's AMX kernel run this weight (the CPU has AMX, K a multiple of 32)?"""
        return bool(self.lib.bf16_amx_available()) and self.panels.shape[1] % 16 == 0

    @functools.cached_property
    def amx_max_rows(self) -> int:
        """Up to how many rows calls run on AMX tiles (from `ONEDNN_MIN_ROWS`; 0 without AMX)."""
        if not self.amx:
            return 0
        return AMX_MAX_ROWS_NARROW if self.out_features <= self.panels.shape[1] * 4 else AMX_MAX_ROWS

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.run(x, amx=False)

    def run(self, x: torch.Tensor, amx: bool) -> torch.Tensor:
        """y for x [M, K]: on AMX tiles (`amx`, where `self.amx`) or with `vdpbf16ps`."""
        x = x.contiguous()
        M, K = x.shape
        y = torch.empty(M, self.out_features, dtype=torch.bfloat16)
        fn = self.lib.bf16_amx_linear if amx else self.lib.bf16_linear
        fn(
            x.data_ptr(),
            self.panels.data_ptr(),
            self.bias.data_ptr() if self.bias is not None else None,
            y.data_ptr(),
            M,
            self.out_features,
            K,
            torch.get_num_threads(),
        )
        return y
