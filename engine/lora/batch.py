"""One step's LoRA work: which rows of the packed batch use which slot, per projection."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.lora.kernels import LoRAKernel, Segment
from engine.lora.shape import PROJECTIONS
from engine.lora.slots import LoRASlots


@dataclass
class LoRABatch:
    """Handed to the model's forward; `apply` adds the LoRA deltas of one layer's projection."""

    slots: LoRASlots
    kernel: LoRAKernel
    segments: dict[str, list[Segment]]  # projection -> its segments; absent: no row needs it
    # projection -> the kernel's prepared segments: made on first use from `segments`, or given
    # (a CUDA graph's static tables, engine/lora/graph.py)
    meta: dict[str, object] = field(default_factory=dict)

    def apply(self, layer: int, projection: str, x: torch.Tensor, y: torch.Tensor) -> None:
        """y: [T, out] (the base projection's output) += the deltas of x: [T, in], in place."""
        meta = self.meta.get(projection)
        if meta is None:
            segs = self.segments.get(projection)
            if not segs:
                return
            meta = self.meta[projection] = self.kernel.prepare(segs, self.slots.device)
        self.kernel.apply(y, x, self.slots.a[projection][layer], self.slots.b[projection][layer], meta)


def build_batch(rows: list[tuple[int, int]], slots: LoRASlots, kernel: LoRAKernel) -> LoRABatch | None:
    """rows: (number of rows, slot or -1 for none) per scheduled item, in packed order. Adjacent
    items of one slot become one segment; rows without an adapter are in none. None when no row
    has an adapter (the forward then pays nothing)."""
    segments: list[Segment] = []
    start = 0
    for n, slot in rows:
        if slot >= 0:
            last = segments[-1] if segments else None
            if last is not None and last.slot == slot and last.end == start:
                segments[-1] = last._replace(end=start + n)
            else:
                segments.append(Segment(start, start + n, slot, slots.rank[slot]))
        start += n
    if not segments:
        return None
    by_proj = {}
    for proj in PROJECTIONS:
        segs = [s for s in segments if proj in slots.targets[s.slot]]
        if segs:
            by_proj[proj] = segs
    return LoRABatch(slots, kernel, by_proj)
