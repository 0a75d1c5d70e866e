"""Every request the engine holds, in one place.

The scheduler's queues say where a sequence is in its life (waiting, running); this table says what
the engine keeps for it: the sequence itself (one per choice of an n > 1 request), its detokenizer
state and its seeded generator, and for an n > 1 request its choices (see engine/choices.py).
Plain Python: torch is named for the type checker only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.request import Sequence, SequenceStatus

if TYPE_CHECKING:
    import torch

    from engine.detokenizer import DetokState


class RequestTable:
    def __init__(self) -> None:
        # by sequence id (a request's id for its first choice, "id#i" for choice i): every
        # sequence added and not yet released
        self.seqs: dict[str, Sequence] = {}
        self.text_states: dict[str, DetokState] = {}  # sequences whose text is detokenized
        self.generators: dict[str, torch.Generator] = {}  # sequences with a seed
        # n > 1, by request id: choices 1..n-1 until choice 0's prompt is computed; every choice's
        # sequence id while the request runs; how many choices have not finished
        self.unstarted_choices: dict[str, list[Sequence]] = {}
        self.choice_ids: dict[str, list[str]] = {}
        self.open_choices: dict[str, int] = {}

    def __contains__(self, seq_id: str) -> bool:
        return seq_id in self.seqs

    def get(self, seq_id: str) -> Sequence | None:
        return self.seqs.get(seq_id)

    def add(self, seq: Sequence) -> None:
        self.seqs[seq.request_id] = seq

    def track(self, seq_id: str, text_state: DetokState | None, generator: torch.Generator | None) -> None:
        """A sequence's detokenizer state and seeded generator, where it has them."""
        if text_state is not None:
            self.text_states[seq_id] = text_state
        if generator is not None:
            self.generators[seq_id] = generator

    def forget(self, seq: Sequence) -> bool:
        """Drop what the table holds for `seq`; True if it was among the added sequences."""
        self.text_states.pop(seq.request_id, None)
        self.generators.pop(seq.request_id, None)
        return self.seqs.pop(seq.request_id, None) is not None

    def waiting(self) -> list[Sequence]:
        return [s for s in self.seqs.values() if s.status is SequenceStatus.WAITING]
