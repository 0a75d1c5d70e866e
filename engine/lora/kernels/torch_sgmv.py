"""Segmented LoRA in plain torch (the CPU path): two matmuls per segment, on row slices.

Why segments and not a per-token gather of A/B: gathering [T, r, in] copies of the adapter
weights costs T * r * (in + out) memory traffic per projection, which on a CPU is far more than
the LoRA arithmetic itself (measured ~4x slower than segments at 64 decode rows, 16 adapters,
r=16, and far worse for long prefill chunks). With rows grouped by adapter, a segment's rows are a
contiguous slice: no copies, exact FLOPs (n * r * (in + out)), the BLAS does the work, and the
only overhead is two calls per segment.

Precision: the slots hold fp32 adapters (engine/model_runner.py), and a bf16 or fp16 model's rows
are upcast for the two matmuls; the base output plus the delta is rounded to the model's dtype once.
That is PEFT's arithmetic (it keeps adapters in fp32 by default and adds the fp32 delta to the
base output before casting back). Rounding the rank-r activations and the delta to bf16 on the way
(the base dtype throughout) put SmolLM2's logits 0.66 away from PEFT's for an adapter whose effect
was 1.63 (docs/lora.md, Precision): enough to leave greedy outputs where PEFT's changes them.
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
            shrunk = x[start:end].to(a.dtype) @ a[slot, :rank].view(k, -1).T  # [n, r*m], in a's dtype
            rows = y[start:end]
            if rows.dtype == a.dtype:
                rows.addmm_(shrunk, b[slot, :rank].view(k, -1))  # += [n, r*m] @ [r*m, out]
            else:  # a bf16/fp16 model with fp32 adapters: the sum in fp32, rounded once (as PEFT does)
                rows.copy_(torch.addmm(rows.to(a.dtype), shrunk, b[slot, :rank].view(k, -1)))
