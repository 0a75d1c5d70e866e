"""What a worker keeps about each request it runs, from its start to its last published result."""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.worker.telemetry import RequestTrace


@dataclass
class InFlight:
    """A request this worker runs: its lane entry and how many tokens of each choice went out."""

    lane: str
    entry_id: str | None  # None: Redis lost the entry (restarted empty); nothing to ACK
    offset: int  # output tokens published so far, resumed ones included
    trace: RequestTrace | None = None  # its spans on this worker (None while tracing is off)
    choice_offsets: dict[int, int] = field(default_factory=dict)  # the same for choices 1.. (n > 1)
    tenant: str = ""  # whose service its tokens are (the lane's virtual counters)
    weight: float = 1.0
    settlement: bytes | None = None  # its quota's, settled with its last result (quotas/settlement.py)
    reply_to: str = ""  # its gateway's inbox, where its last result is echoed ("": none; hints.py)
    published: int = 0  # results this worker put on its result stream (while it has a reply_to)

    def offset_of(self, index: int) -> int:
        return self.offset if index == 0 else self.choice_offsets.get(index, 0)

    def advance(self, index: int, num_tokens: int) -> None:
        if index == 0:
            self.offset += num_tokens
        else:
            self.choice_offsets[index] = self.choice_offsets.get(index, 0) + num_tokens
