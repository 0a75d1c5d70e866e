"""INT8 weight quantization (EngineConfig.quantization = "int8").

Each linear layer's weight is stored as int8 with one fp32 scale per output channel (symmetric:
scale = max |w| / 127 over the row), a quarter of fp32's bytes. On CPU every call runs
`csrc/int8_linear.c`: it quantizes the activations dynamically to int8 in blocks of 32 along the
input dimension (scale = max |x| / 127 per block, as llama.cpp does for its quantized dot products)
and multiplies 8-bit integers, so a decode step is bound by reading the int8 weights rather than by
converting them to fp32. `reference` is that arithmetic in torch, in fp64: int8_linear.c sums
each block's products in eight int32 lanes and those in fp32, so it differs from it by fp32
rounding (rtol 1e-5). Where the CPU has AVX512-VNNI every call takes `csrc/int8_vnni.c`
instead: 512-bit `vpdpbusd` over the weight in panels of 32 output channels (`pack_panels`,
bf16_linear.c's layout), at about bf16's speed per call for batches where int8_linear.c's tiles
take twice as long, and as fast at one row; it sums each block's products exactly in int32 and the
blocks in fp64, so its outputs are `reference`'s to the bit (and no row's depends on the batch).
On other devices, without a C
compiler, or when the input dimension is not a multiple of 32 or the output dimension not one of 4,
the dense matmul runs on unquantized activations against the int8 rows converted to the activations'
dtype (exact: |q| <= 127), and the per-channel scale multiplies the output: no fp32 copy of the
weight is made per call (on a GPU that was 3x the weight traffic of a bf16 model). For
int8_linear.c the int8 rows are stored interleaved in groups of four (`pack`): a tile of four
output channels then reads one sequential stream, which the hardware prefetcher follows.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch
import torch.nn.functional as F

from engine import native

QUANTIZATIONS = (None, "int8")
BLOCK = 32  # activation quantization block along the input dimension (the C kernel's QK)
GROUP = 4  # output channels the C kernel's weight layout interleaves (its GROUP)
SOURCE = Path(__file__).parent / "csrc" / "int8_linear.c"
VNNI_SOURCE = Path(__file__).parent / "csrc" / "int8_vnni.c"
PANEL = 32  # output channels per panel of the VNNI kernel's layout (its NR)


def _library() -> ctypes.CDLL | None:
    """The C kernel, or None without a C compiler (the dequantizing path then serves every call)."""
    return native.library(SOURCE, {"int8_linear_f32": [ctypes.c_void_p] * 5 + [ctypes.c_int] * 4})


def vnni_library() -> ctypes.CDLL | None:
    """The AVX512-VNNI kernel (`csrc/int8_vnni.c`), or None where the CPU lacks AVX512-VNNI
    (the library is built for the machine's own instruction set: `engine/native.py`)."""
    lib = native.library(
        VNNI_SOURCE,
        {"int8_vnni_linear_f32": [ctypes.c_void_p] * 5 + [ctypes.c_int] * 4, "int8_vnni_available": []},
    )
    if lib is None:
        return None
    lib.int8_vnni_available.restype = ctypes.c_int
    return lib if lib.int8_vnni_available() else None


def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] float -> (int8 [N, K], fp32 scales [N]), symmetric per output channel."""
    w = weight.float()
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q.contiguous(), scale.contiguous()


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[M, K] float (K % BLOCK == 0) -> (int8 values [M, K], fp32 block scales [M, K / BLOCK])."""
    blocks = x.float().reshape(x.shape[0], -1, BLOCK)
    amax = blocks.abs().amax(dim=-1)
    d = amax * (1.0 / 127.0)  # the C kernel's arithmetic, to the bit
    # a true division (a scalar over a tensor would be 127 * reciprocal(amax): one ulp away)
    inv = torch.where(amax > 0, torch.full_like(amax, 127.0) / amax, torch.zeros_like(amax))
    q = torch.round(blocks * inv[..., None]).clamp(-127, 127).to(torch.int8)
    return q.reshape(x.shape), d


def reference(
    x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """What the C kernel computes, in torch.

    y[m, n] = scale[n] * sum_b d[m, b] * (xq[m, b] . q[n, b]) + bias
    """
    xq, d = quantize_activations(x)
    M, K = x.shape
    prods = torch.einsum(
        "mbk,nbk->mnb", xq.reshape(M, -1, BLOCK).double(), q.reshape(q.shape[0], -1, BLOCK).double()
    )
    y = (prods * d.double()[:, None, :]).sum(-1) * scale.double()
    return (y + bias.double() if bias is not None else y).float()


def pack(q: torch.Tensor) -> torch.Tensor:
    """int8 [N, K] rows -> the C kernel's layout: groups of GROUP rows interleaved block by block,
    [N / GROUP, K / BLOCK, GROUP, BLOCK] (a tile of GROUP rows reads one sequential stream)."""
    N, K = q.shape
    return q.reshape(N // GROUP, GROUP, K // BLOCK, BLOCK).transpose(1, 2).contiguous()


def pack_panels(q: torch.Tensor) -> torch.Tensor:
    """int8 [N, K] rows -> the VNNI kernel's layout: unsigned bytes q + 128 in panels of PANEL output
    channels with k four at a time side by side, [ceil(N / PANEL), K / 4, PANEL, 4] (the last
    panel padded with zero weights)."""
    N, K = q.shape
    padded = torch.zeros(-(-N // PANEL) * PANEL, K, dtype=torch.int16)
    padded[:N] = q
    u8 = (padded + 128).to(torch.uint8)  # [N', K]
    return u8.reshape(-1, PANEL, K // 4, 4).transpose(1, 2).contiguous()


def unpack_panels(panels: torch.Tensor, n: int) -> torch.Tensor:
    """`pack_panels`' inverse: int8 [n, K] rows."""
    p, kq, width, four = panels.shape
    rows = panels.transpose(1, 2).reshape(p * width, kq * four)[:n]
    return (rows.to(torch.int16) - 128).to(torch.int8)


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """`pack`'s inverse: [N, K] rows."""
    groups, blocks, group, block = packed.shape
    return packed.transpose(1, 2).reshape(groups * group, blocks * block)


class Int8Linear:
    """y = x @ (q * scale).T + bias, with the Linear interface (engine/models/linear.py); on CPU with
    the activations quantized per block (`reference`)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        self.dtype = weight.dtype
        q, self.scale = quantize(weight)
        N, K = q.shape
        self.in_features = K
        self.bias = bias
        self._bias32 = bias.float().contiguous() if bias is not None else None
        # the scale in each activation dtype met (the dense path)
        self._scale_as: dict[torch.dtype, torch.Tensor] = {}
        fits = weight.device.type == "cpu" and N % GROUP == 0 and K % BLOCK == 0
        self.lib = _library() if fits else None
        # the AVX512-VNNI kernel where the CPU has it (every batch), else int8_linear.c
        self.vnni = vnni_library() if self.lib is not None else None
        # what the C kernel reads (pack_panels' or pack's layout), or the int8 rows
        self.qweight = q if self.lib is None else pack_panels(q) if self.vnni is not None else pack(q)

    @property
    def has_cpu_kernel(self) -> bool:
        """Do calls run the int8 C kernel (it reads `kernel_weight`, `kernel_scale`, `kernel_bias`)?"""
        return self.lib is not None

    @property
    def kernel_weight(self) -> torch.Tensor:
        """The C kernel's weight: with `vnni`, uint8 [ceil(N / PANEL), K / 4, PANEL, 4] (`pack_panels`),
        else int8 [N / GROUP, K / BLOCK, GROUP, BLOCK] (`pack`)."""
        return self.qweight

    @property
    def kernel_scale(self) -> torch.Tensor:
        """fp32 [N]: one scale per output channel."""
        return self.scale

    @property
    def kernel_bias(self) -> torch.Tensor | None:
        """The C kernel's bias: fp32 [N], contiguous, or None."""
        return self._bias32

    @property
    def rows(self) -> torch.Tensor:
        """The int8 weight as [N, K] rows."""
        if self.qweight.dim() == 2:
            return self.qweight
        return (
            unpack_panels(self.qweight, self.scale.shape[0])
            if self.vnni is not None
            else unpack(self.qweight)
        )

    @property
    def weight(self) -> torch.Tensor:
        """The dequantized weight (model dtype)."""
        return (self.rows.float() * self.scale[:, None]).to(self.dtype)

    @property
    def nbytes(self) -> int:
        """The int8 weight's bytes and its scales' (the VNNI panels' padding to 32 channels aside)."""
        N = self.scale.numel()
        return N * self.in_features + 4 * N

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        M = x.shape[0]
        if self.lib is not None and x.dim() == 2 and M > 0 and x.device.type == "cpu":
            x32 = x.float().contiguous()
            N = self.scale.shape[0]
            y = torch.empty(M, N, dtype=torch.float32)
            kernel = self.vnni.int8_vnni_linear_f32 if self.vnni is not None else self.lib.int8_linear_f32
            kernel(
                x32.data_ptr(),
                self.qweight.data_ptr(),
                self.scale.data_ptr(),
                self._bias32.data_ptr() if self._bias32 is not None else None,
                y.data_ptr(),
                M,
                N,
                x32.shape[1],
                torch.get_num_threads(),
            )
            return y if x.dtype == torch.float32 else y.to(x.dtype)
        scale = self._scale_as.get(x.dtype)
        if scale is None:
            scale = self._scale_as[x.dtype] = self.scale.to(x.dtype)
        y = F.linear(x, self.rows.to(x.dtype)) * scale  # [M, N]; no dequantized weight
        return y + self.bias if self.bias is not None else y
