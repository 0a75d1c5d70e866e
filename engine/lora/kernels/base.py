"""The interface of a batched LoRA kernel (see the package docstring for the arithmetic)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, NamedTuple

import torch


class Segment(NamedTuple):
    start: int  # first row of the packed batch
    end: int  # one past the last row
    slot: int  # adapter slot
    rank: int  # the slot's adapter's rank (<= the slots' max rank)


class LoRAKernel(ABC):
    name = "abstract"
    # whether `apply` launches from the prepared tensors alone (no host value of the step's
    # segments): then a CUDA graph can capture it over static segment tables (engine/lora/graph.py)
    supports_graphs = False

    def prepare(self, segments: list[Segment], device: torch.device) -> Any:
        """Once per step and projection: whatever `apply` needs about the segments."""
        return segments

    @abstractmethod
    def apply(self, y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, meta: Any) -> None:
        """y: [T, out] += LoRA delta of x: [T, in] for the rows of `meta`'s segments, in place.
        a: [S, R, m, in], b: [S, R, m, out] (one layer's slots)."""
