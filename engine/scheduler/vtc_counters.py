"""Virtual token counters (Sheng et al., "Fairness in Serving Large Language Models", OSDI'24).

Each tenant's counter grows by the weighted service it receives, divided by the tenant's weight
(`Sequence.weight`): w_in per prompt token as it is computed for the first time (recomputation
after a preemption is the engine's loss, not the tenant's gain) and w_out per output token. So
that several admissions in one step see each other, an admission also books the whole remaining
prompt provisionally until the step's real service is counted. The least-served tenant with
waiting work is admitted first. A tenant that becomes active again (no waiting or running request
before this one) is lifted to the smallest counter of the active tenants: idling banks no credit.

The lift is taken as of the request's arrival (`Sequence.arrival_time`: for a worker's request, when
the gateway queued it), not as of the moment it reaches this engine. A request that waited in a lane
was backlogged there: the service other tenants got meanwhile (the step in flight as it arrived,
the steps before its worker took it) is service they got beyond it, which VTC repays, as it does
for a tenant that waits in this engine's own queue. Lifting it to the counters of the moment it
reached the engine would make that lead permanent. So the counters of the active tenants are kept
as they stood at each step's start and end (`snapshot`, HISTORY_S back at most); an arrival older
than that history is lifted to the counters now.
"""

from __future__ import annotations

import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable

from engine.request import Sequence

HISTORY_S = 120.0  # how far back an arrival is looked up (a lane wait longer than this: as now)
HISTORY_ENTRIES = 200_000  # counters kept in all snapshots together, at most (many tenants: less time)


class VirtualTokenCounters:
    def __init__(self, w_in: float = 1.0, w_out: float = 2.0, clock: Callable[[], float] | None = None):
        self.w_in = w_in
        self.w_out = w_out
        self.clock = clock or time.monotonic
        self.counters: dict[str, float] = {}
        self.active: dict[str, int] = {}  # tenant -> waiting + running requests
        self._prompt_done: dict[str, int] = {}  # request id -> prompt tokens charged
        self._pending: dict[str, float] = {}  # tenant -> prompts booked by this step's admissions
        # the active tenants' counters at each step's start and end, oldest first (times: when)
        self._times: list[float] = []
        self._snaps: list[dict[str, float]] = []
        self._kept = 0  # counters in _snaps
        # tenant -> when it became active, and its counter then (lifted), oldest first
        self._entries: dict[str, tuple[list[float], list[float]]] = {}

    def arrive(self, seq: Sequence) -> None:
        t = seq.tenant
        if not self.active.get(t):
            others = [o for o, n in self.active.items() if n and o != t]
            if others:
                floor = min(self.as_of(o, seq.arrival_time) for o in others)
                self.counters[t] = max(self.counters.get(t, 0.0), floor)
            self.counters.setdefault(t, 0.0)
            self._entered(t)
        self.active[t] = self.active.get(t, 0) + 1

    def _entered(self, tenant: str) -> None:
        times, values = self._entries.setdefault(tenant, ([], []))
        now = self.clock()
        times.append(now)
        values.append(self.counters[tenant])
        drop = bisect_right(times, now - HISTORY_S)
        if drop:
            del times[:drop], values[:drop]

    def as_of(self, tenant: str, when: float) -> float:
        """The tenant's counter at ``when``: from the last snapshot taken by then, or, where the
        tenant was not active then, as it became active after that snapshot (its counter does not
        move while it is idle, and idling banks no credit); its counter now where ``when`` is older
        than every snapshot kept (or none is)."""
        now = self.counters.get(tenant, 0.0)
        i = bisect_right(self._times, when) - 1
        if i < 0:
            return now
        snap = self._snaps[i]
        if tenant in snap:
            return snap[tenant]
        times, values = self._entries.get(tenant, ((), ()))
        j = bisect_left(times, self._times[i])  # its first activation since that snapshot
        return values[j] if j < len(values) else now

    def snapshot(self) -> None:
        """Keep the active tenants' counters as they stand now (a step starts or ends)."""
        now = self.clock()
        snap = {t: self.counters.get(t, 0.0) for t, n in self.active.items() if n}
        if self._snaps and self._snaps[-1] == snap:
            return  # unchanged: the last snapshot stands for now too
        self._times.append(now)
        self._snaps.append(snap)
        self._kept += len(snap)
        drop = 0
        while drop < len(self._times) - 1 and (
            now - self._times[drop] > HISTORY_S or self._kept > HISTORY_ENTRIES
        ):
            self._kept -= len(self._snaps[drop])
            drop += 1
        if drop:
            del self._times[:drop], self._snaps[:drop]

    def left(self, seq: Sequence) -> None:
        self.active[seq.tenant] = self.active.get(seq.tenant, 1) - 1
        self._prompt_done.pop(seq.request_id, None)

    def value(self, tenant: str) -> float:
        return self.counters.get(tenant, 0.0) + self._pending.get(tenant, 0.0)

    def least_served(self, tenants: Iterable[str]) -> str:
        """The tenant of `tenants` with the smallest counter (ties: the one with fewer active requests)."""
        return min(tenants, key=lambda t: (self.value(t), self.active.get(t, 0)))

    def begin_step(self) -> None:
        self._pending.clear()

    def admitted(self, seq: Sequence) -> None:
        left = seq.num_prompt_tokens - self._prompt_done.get(seq.request_id, 0)
        self._pending[seq.tenant] = self._pending.get(seq.tenant, 0.0) + self.w_in * max(0, left) / seq.weight

    def served(self, seq: Sequence, num_tokens: int) -> None:
        """seq computes num_tokens this step; a chunk reaching the end samples one output token."""
        end = min(seq.num_computed_tokens + num_tokens, seq.num_prompt_tokens)
        done = self._prompt_done.get(seq.request_id, 0)
        if end > done:
            self._prompt_done[seq.request_id] = end
            self.counters[seq.tenant] += self.w_in * (end - done) / seq.weight
        if seq.num_computed_tokens + num_tokens == seq.num_tokens:
            self.counters[seq.tenant] += self.w_out / seq.weight
