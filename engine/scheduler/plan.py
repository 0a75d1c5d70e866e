"""One step's plan: which sequences compute how many tokens."""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.request import Sequence


@dataclass
class ScheduledSeq:
    seq: Sequence
    num_tokens: int  # tokens computed this step, from seq.num_computed_tokens on

    @property
    def samples(self) -> bool:
        """Does this chunk reach the end of the sequence (so a new token is sampled)?"""
        return self.seq.num_computed_tokens + self.num_tokens == self.seq.num_tokens


@dataclass
class StepPlan:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    refused: list[tuple[Sequence, Exception]] = field(default_factory=list)  # waiting, refused by the policy

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled
