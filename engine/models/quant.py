"""INT8 weight quantization (EngineConfig.quantization = "int8").

Each linear layer's weight is stored as int8 with one fp32 scale per output channel (symmetric:
scale = max |w| / 127 over the row), a quarter of fp32's bytes. On CPU every call runs
`csrc/int8_linear.c`: it quantizes the activations dynamically to int8 in blocks of 32 along the
input dimension (scale = max |x| / 127 per block, as llama.cpp does for its quantized dot products)
and multiplies 8-bit integers, so a decode step is bound by reading the int8 weights rather than by
converting them to fp32. `reference` is the same arithmetic in torch. On other devices, without a C
compiler, or when the input dimension is not a multiple of 32 or the output dimension not one of 4,
the dense matmul runs on unquantized activations against the int8 rows converted to the activations'
dtype (exact: |q| <= 127), and the per-channel scale multiplies the output: no fp32 copy of the
weight is made per call (on a GPU that was 3x the weight traffic of a bf16 model). For the
kernel the int8 rows are stored interleaved in groups of four (`pack`): a tile of four output
channels then reads one sequential stream, which the hardware prefetcher follows.
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


def _library() -> ctypes.CDLL | None:
    """The C kernel, or None without a C compiler (the dequantizing path then serves every call)."""
    return native.library(SOURCE, {"int8_linear_f32": [ctypes.c_void_p] * 5 + [ctypes.c_int] * 4})


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
        self.bias = bias
        self._bias32 = bias.float().contiguous() if bias is not None else None
        # the scale in each activation dtype met (the dense path)
        self._scale_as: dict[torch.dtype, torch.Tensor] = {}
        fits = weight.device.type == "cpu" and N % GROUP == 0 and K % BLOCK == 0
        self.lib = _library() if fits else None
        self.qweight = pack(q) if self.lib is not None else q  # what the C kernel reads / int8 rows

    @property
    def has_cpu_kernel(self) -> bool:
        """Do calls run the int8 C kernel (it reads `kernel_weight`, `kernel_scale`, `kernel_bias`)?"""
        return self.lib is not None

    @property
    def kernel_weight(self) -> torch.Tensor:
        """The C kernel's weight: int8 [N / GROUP, K / BLOCK, GROUP, BLOCK] (see `pack`)."""
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
        return unpack(self.qweight) if self.qweight.dim() == 4 else self.qweight

    @property
    def weight(self) -> torch.Tensor:
        """The dequantized weight (model dtype)."""
        return (self.rows.float() * self.scale[:, None]).to(self.dtype)

    @property
    def nbytes(self) -> int:
        return self.qweight.numel() + 4 * self.scale.numel()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        M = x.shape[0]
        if self.lib is not None and x.dim() == 2 and M > 0 and x.device.type == "cpu":
            x32 = x.float().contiguous()
            N = self.scale.shape[0]
            y = torch.empty(M, N, dtype=torch.float32)
            self.lib.int8_linear_f32(
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
