"""Virtual token counters (Sheng et al., "Fairness in Serving Large Language Models", OSDI'24).

Each tenant's counter grows by the weighted service it receives, divided by the tenant's weight
(`Sequence.weight`): w_in per prompt token as it is computed for the first time (recomputation
after a preemption is the engine's loss, not the tenant's gain) and w_out per output token. So
that several admissions in one step see each other, an admission also books the whole remaining
prompt provisionally until the step's real service is counted. The least-served tenant with
waiting work is admitted first. A tenant that becomes active again (no waiting or running request
before this one) is lifted to the smallest counter of the active tenants: idling banks no credit.
"""

from __future__ import annotations

from collections.abc import Iterable

from engine.request import Sequence


class VirtualTokenCounters:
    def __init__(self, w_in: float = 1.0, w_out: float = 2.0):
        self.w_in = w_in
        self.w_out = w_out
        self.counters: dict[str, float] = {}
        self.active: dict[str, int] = {}  # tenant -> waiting + running requests
        self._prompt_done: dict[str, int] = {}  # request id -> prompt tokens charged
        self._pending: dict[str, float] = {}  # tenant -> prompts booked by this step's admissions

    def arrive(self, seq: Sequence) -> None:
        t = seq.tenant
        if not self.active.get(t):
            others = [self.counters.get(o, 0.0) for o, n in self.active.items() if n and o != t]
            if others:
                self.counters[t] = max(self.counters.get(t, 0.0), min(others))
        self.counters.setdefault(t, 0.0)
        self.active[t] = self.active.get(t, 0) + 1

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
