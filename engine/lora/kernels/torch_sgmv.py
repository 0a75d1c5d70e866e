"""Segmented LoRA in plain torch (the CPU path): two matmuls per segment, on row slices.

Why segments and not a per-token gather of A/B: gathering [T, r, in] copies of the adapter
weights costs T * r * (in + out) memory traffic per projection, which on a CPU is far more than
the LoRA arithmetic itself (measured ~4x slower than segments at 64 decode rows, 16 adapters,
r=16, and far worse for long prefill chunks). With rows grouped by adapter, a segment's rows are a
contiguous slice: no copies, exact FLOPs (n * r * (in + out)), the BLAS does the work, and the
only overhead is two calls per segment.
"""

from __future__ import annotations

import torch

from engine.lora.kernels.base import LoRAKernel, Segment


class TorchSGMV(LoRAKernel):
    name = "torch"

    def apply(
        self, y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, meta: list[Segment]
    ) -> None:
        m = a.shape[2]
        for start, end, slot, rank in meta:
            k = rank * m
            shrunk = x[start:end] @ a[slot, :rank].view(k, -1).T  # [n, r*m]
            y[start:end].addmm_(shrunk, b[slot, :rank].view(k, -1))  # += [n, r*m] @ [r*m, out]
