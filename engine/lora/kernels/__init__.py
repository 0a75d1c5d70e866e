"""Batched LoRA kernels behind one interface, with a registry (`make_kernel`).

A step's rows are grouped so that every adapter's rows are contiguous (engine/lora/batch.py); a
kernel adds, for each segment (start, end, slot, rank) of a projection,
    y[start:end] += (x[start:end] @ a[slot, :rank].view(rank*m, in).T) @ b[slot, :rank].view(rank*m, out)
in place, where a: [S, R, m, in] and b: [S, R, m, out] are one layer's slot tensors. Rows in no
segment (no adapter) are not touched."""

from __future__ import annotations

from collections.abc import Callable

from engine.lora.kernels.base import LoRAKernel, Segment
from engine.lora.kernels.torch_sgmv import TorchSGMV

KERNELS: dict[str, Callable[[], LoRAKernel]] = {"torch": TorchSGMV}


def _triton() -> LoRAKernel:
    from engine.lora.kernels.triton_sgmv import TritonSGMV  # imports triton: GPU path only

    return TritonSGMV()


KERNELS["triton"] = _triton


def make_kernel(name: str, device_type: str) -> LoRAKernel:
    """ "auto": triton on a CUDA device, torch elsewhere."""
    if name == "auto":
        name = "triton" if device_type == "cuda" else "torch"
    if name not in KERNELS:
        raise ValueError(f"unknown LoRA kernel {name!r}; known: {sorted(KERNELS)} or 'auto'")
    return KERNELS[name]()


__all__ = ["KERNELS", "LoRAKernel", "Segment", "make_kernel"]
