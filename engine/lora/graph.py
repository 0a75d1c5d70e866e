"""LoRA inside the decode CUDA graphs (engine/cuda_graphs.py): static segment tables.

A graph replays the launches it captured, grids included, so the LoRA launches of a captured batch
size b must not depend on the step: each projection's segments live in a static device table
[4, G] (starts, ends, slots, ranks; G = max_loras, the most segments a decode step has: its rows
are grouped by adapter), copied in before each replay, and the Triton kernel runs with the
worst-case grid of that size (rows b, rank the slots' max_lora_rank, G segments). Table columns
past the step's segments are zero (empty segments: their programs return at once), as are the
padding rows' (in no segment: not touched). The adapters' weights are the slot tensors, allocated
before capture and never reallocated, so an adapter loaded into a slot later is read by the graph.

Only a kernel with `supports_graphs` (triton) runs here; the split-K plan of the worst-case grid
may differ from a step's own eager plan, which changes the fp32 summation order of the rank-r
intermediate only.
"""

from __future__ import annotations

import torch

from engine.lora.batch import LoRABatch
from engine.lora.kernels import LoRAKernel
from engine.lora.slots import LoRASlots


class StaticLoRA:
    def __init__(self, slots: LoRASlots, kernel: LoRAKernel):
        assert kernel.supports_graphs, kernel.name
        slots.allocate()
        self.slots = slots
        self.kernel = kernel
        self.projections = list(slots.shape.projections)
        self.width = slots.max_loras
        # rows of 16 bytes' multiples: every table starts aligned, as Triton specialises pointers on
        pad = -(-self.width // 4) * 4
        self.tables = torch.zeros(len(self.projections), 4, pad, dtype=torch.int32, device=slots.device)
        self.pin = slots.device.type == "cuda"

    def fits(self, lora: LoRABatch) -> bool:
        return all(len(s) <= self.width for s in lora.segments.values())

    def batch(self, rows: int) -> LoRABatch:
        """The LoRABatch a graph of `rows` rows captures: every projection over its static table."""
        from engine.lora.kernels.triton_sgmv import SegmentTensors

        meta: dict[str, object] = {}
        for proj, t in zip(self.projections, self.tables):
            t = t[:, : self.width]
            meta[proj] = SegmentTensors(t[0], t[1], t[2], t[3], rows, self.slots.max_rank)
        return LoRABatch(self.slots, self.kernel, {}, meta)

    def load(self, lora: LoRABatch) -> None:
        """The step's segments into the static tables (one copy, not waited for)."""
        host = torch.zeros(self.tables.shape, dtype=torch.int32, pin_memory=self.pin)
        for i, proj in enumerate(self.projections):
            segs = lora.segments.get(proj)
            if segs:
                host[i, :, : len(segs)] = torch.tensor(segs, dtype=torch.int32).T
        self.tables.copy_(host, non_blocking=True)
