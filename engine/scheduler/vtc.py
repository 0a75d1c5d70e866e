"""Virtual token counters (Sheng et al., "Fairness in Serving Large Language Models", OSDI'24).

Each tenant's counter grows by the weighted service it receives, divided by the tenant's weight
(`Sequence.weight`): w_in per prompt token, charged when the request is first admitted (as in the
paper, so a tenant admitted several times within one step is seen as served at once), and w_out
per output token, charged as each one is computed. Recomputation after a preemption is not charged
again: it is the engine's loss, not the tenant's gain. The least-served tenant with waiting work is
admitted first. A tenant that becomes active again (no waiting or running request before this one)
is lifted to the smallest counter of the active tenants, so idling banks no credit.
"""
from __future__ import annotations

from engine.request import Sequence


class VirtualTokenCounters:
    def __init__(self, w_in: float = 1.0, w_out: float = 2.0):
        self.w_in = w_in
        self.w_out = w_out
        self.counters: dict[str, float] = {}
        self.active: dict[str, int] = {}  # tenant -> waiting + running requests
        self._charged: set[str] = set()  # request ids whose prompt was charged

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
        self._charged.discard(seq.request_id)

    def least_served(self, tenants) -> str:
        """The tenant of `tenants` with the smallest counter (ties: the first given)."""
        return min(tenants, key=lambda t: self.counters.get(t, 0.0))

    def admitted(self, seq: Sequence) -> None:
        if seq.request_id not in self._charged:
            self._charged.add(seq.request_id)
            self.counters[seq.tenant] += self.w_in * seq.num_prompt_tokens / seq.weight

    def served(self, seq: Sequence, num_tokens: int) -> None:
        """seq computes num_tokens this step; a chunk reaching the end samples one output token."""
        if seq.num_computed_tokens + num_tokens == seq.num_tokens:
            self.counters[seq.tenant] += self.w_out / seq.weight
