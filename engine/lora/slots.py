"""Adapter slots on the device: `max_loras` adapters resident at once, each padded to
`max_lora_rank`, loaded on demand from host memory; the least recently used adapter that no
running sequence needs is evicted when a slot is wanted.

Per fused projection p (m modules, in/out features as in weights.py), allocated on first use:
    a[p]: [L, S, R, m, in]     b[p]: [L, S, R, m, out]     (S = max_loras, R = max_lora_rank)
A slot holding an adapter of rank r < R is used at rank r: the kernels read only its first r rows
(rows r..R-1 keep whatever was there), and only the projections the adapter targets.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import torch

from engine.lora.shape import ModelShape
from engine.lora.weights import LoRAWeights


class LoRASlots:
    def __init__(
        self, shape: ModelShape, max_loras: int, max_rank: int, dtype: torch.dtype, device: torch.device
    ):
        self.shape = shape
        self.max_loras = max_loras
        self.max_rank = max_rank
        self.dtype = dtype
        self.device = device
        self.a: dict[str, torch.Tensor] = {}
        self.b: dict[str, torch.Tensor] = {}
        self.slot_of: OrderedDict[str, int] = OrderedDict()  # uid -> slot, least recently used first
        self.free = list(range(max_loras))
        self.rank = [0] * max_loras
        self.targets: list[frozenset[str]] = [frozenset()] * max_loras  # projections each slot's adapter has
        self.loads = 0
        self.evictions = 0

    def allocate(self) -> None:
        """The slot tensors, once (a CUDA graph captured over them reads them by pointer: they are
        never reallocated; loading an adapter copies into them)."""
        if self.a:
            return
        L, S, R = self.shape.num_layers, self.max_loras, self.max_rank
        for proj, modules in self.shape.projections.items():
            d_in, d_out = self.shape.projection_dims(proj)
            self.a[proj] = torch.zeros(L, S, R, len(modules), d_in, dtype=self.dtype, device=self.device)
            self.b[proj] = torch.zeros(L, S, R, len(modules), d_out, dtype=self.dtype, device=self.device)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.a.values(), *self.b.values()))

    def activate(self, uids: set[str], fetch: Callable[[str], LoRAWeights]) -> None:
        """Make every adapter in `uids` resident (the adapters of all running sequences), loading
        missing ones from host memory (`fetch`) into free slots or over the least recently used
        adapter outside `uids`. The scheduler admits no sequence that would need more than
        max_loras distinct adapters, so this always fits."""
        if len(uids) > self.max_loras:
            raise RuntimeError(f"{len(uids)} adapters in use, only {self.max_loras} slots")
        for uid in uids:
            if uid in self.slot_of:
                self.slot_of.move_to_end(uid)
        for uid in sorted(uids - self.slot_of.keys()):
            if not self.free:
                victim = next(u for u in self.slot_of if u not in uids)  # least recently used first
                self.free.append(self.slot_of.pop(victim))
                self.evictions += 1
            self._load(self.free.pop(), fetch(uid))

    def _load(self, slot: int, w: LoRAWeights) -> None:
        self.allocate()
        r = w.rank
        for proj in w.a:
            self.a[proj][:, slot, :r].copy_(w.a[proj], non_blocking=True)
            self.b[proj][:, slot, :r].copy_(w.b[proj], non_blocking=True)
        self.rank[slot] = r
        self.targets[slot] = frozenset(w.a)
        self.slot_of[w.uid] = slot
        self.loads += 1
