"""Per-tenant fairness by virtual token counters (VTC, Sheng et al., OSDI'24), alone or inside tiers.

The tiered queue of priority.py, keyed by tenant inside each tier: `peek` takes the tier's tenant
with the smallest counter (vtc_counters.py). Inside a tier a waiting head may also push out work
of a more-served tenant: for the token budget, that tenant's tokens of this step wait a step
(`_more_served`); at the sequence cap or the KV limit, one of the sequences a tenant holds beyond
its weighted share is preempted (`_over_share`). "vtc" is one tier (`Sequence.priority` ignored);
"priority+vtc" keeps the strict tiers and their starvation guard.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.config import SchedulerConfig
from engine.request import Sequence
from engine.scheduler.plan import StepPlan
from engine.scheduler.policy import SchedulingPolicy
from engine.scheduler.priority import TieredPolicy, progress_lost
from engine.scheduler.vtc_counters import VirtualTokenCounters


class FairTieredPolicy(TieredPolicy):
    """The tiered queue with VTC order and displacement between the tenants of a tier."""

    def __init__(
        self,
        config: SchedulerConfig | None = None,
        *,
        clock: Callable[[], float] | None = None,
        inner: SchedulingPolicy | None = None,
    ) -> None:
        super().__init__(config, clock=clock, inner=inner)
        self.vtc = VirtualTokenCounters(
            self.config.vtc_input_weight, self.config.vtc_output_weight, clock=self.clock
        )
        self.weights: dict[str, float] = {}  # tenant -> its weight (latest request's)

    # ---- the tiered queue's keys and accounting, with counters -----------------------------
    def _tenant(self, seq: Sequence) -> str:
        return seq.tenant

    def _choose_tenant(self, heaps: dict[str, list]) -> str:
        return self.vtc.least_served(heaps)

    def add(self, seq: Sequence) -> None:
        self.vtc.arrive(seq)
        self.weights[seq.tenant] = seq.weight
        super().add(seq)

    def pop(self) -> Sequence:
        seq = super().pop()
        self.vtc.admitted(seq)
        return seq

    def begin_step(self, running: list[Sequence]) -> list[tuple[Sequence, Exception]]:
        refused = super().begin_step(running)
        self.vtc.begin_step()
        self.vtc.snapshot()  # what the tenants had before this step: an arrival during it is owed it
        return refused

    def observe(self, plan: StepPlan, seconds: float) -> None:
        super().observe(plan, seconds)
        self.vtc.snapshot()  # after the step: an arrival from now on is lifted past it

    def on_scheduled(self, seq: Sequence, num_tokens: int) -> None:
        super().on_scheduled(seq, num_tokens)
        self.vtc.served(seq, num_tokens)

    def on_finished(self, seq: Sequence) -> None:
        self.vtc.left(seq)

    # ---- displacement between the tenants of a tier ----------------------------------------
    def _victim_key(self, seq: Sequence) -> tuple:
        """Lowest tier first, then the most-served tenant, then least progress lost."""
        return (self.tier(seq), -self.vtc.counters.get(seq.tenant, 0.0)) + progress_lost(seq)

    def _displace_in_tier(
        self, seq: Sequence, same: list[Sequence], for_budget: bool, plan: StepPlan | None
    ) -> Sequence | None:
        return self._more_served(seq, same, plan) if for_budget else self._over_share(seq, same)

    def _more_served(
        self, seq: Sequence, candidates: list[Sequence], plan: StepPlan | None
    ) -> Sequence | None:
        """For the token budget: a running sequence of a tenant that stays at least as served as
        seq's tenant even once seq's remaining prompt is counted (so the two never trade places
        back and forth within a step; this keeps VTC's 2U bound), from the most-served such tenant,
        its largest chunk of this step first. Its tokens wait one step; it loses no work. Without
        this a light tenant's prompt is split behind a heavy tenant's decodes and chunks and its
        first token comes a step or two later than it would alone."""
        mine = (
            self.vtc.value(seq.tenant)
            + self.vtc.w_in * (seq.num_tokens - seq.num_computed_tokens) / seq.weight
        )
        over = [c for c in candidates if c.tenant != seq.tenant and self.vtc.value(c.tenant) >= mine]
        if not over:
            return None
        chunk = {id(item.seq): item.num_tokens for item in plan.scheduled} if plan is not None else {}
        return max(over, key=lambda c: (self.vtc.value(c.tenant), chunk.get(id(c), 0), -c.arrival_time))

    def defers(self, seq: Sequence, other: Sequence) -> bool:
        """A lower tier's decode, or in seq's tier one of a tenant more served than seq's even once
        seq's remaining prompt is counted: the order `_displace_in_tier` keeps for the budget, so
        the two tenants never trade places (VTC's 2U bound holds)."""
        if super().defers(seq, other):
            return True
        if self.tier(other) != self.tier(seq) or other.tenant == seq.tenant:
            return False
        prompt = self.vtc.w_in * (seq.num_tokens - seq.num_computed_tokens) / seq.weight
        return self.vtc.value(other.tenant) >= self.vtc.value(seq.tenant) + prompt

    def urgent(self, seq: Sequence) -> bool:
        """Urgent as in a tiered queue, or when seq's tenant holds at least one sequence less than
        its weighted share of its tier."""
        return super().urgent(seq) or self._excess(self.tier(seq), seq.tenant)(seq.tenant) <= -1

    def urgent_present(self, running: list[Sequence]) -> bool:
        """As in a tiered queue, or a tenant with work holds at least one running sequence less
        than its weighted share of its tier."""
        if super().urgent_present(running):
            return True
        tenants: dict[int, set[str]] = {}
        for s in running:
            tenants.setdefault(self.tier(s), set()).add(s.tenant)
        for t, q in self.queues.items():
            tenants.setdefault(t, set()).update(tenant for tenant, h in q.items() if h)
        return any(
            len(names) > 1 and any(self._excess(tier, n, running)(n) <= -1 for n in names)
            for tier, names in tenants.items()
        )

    def displaceable(self, priority: int, tenant: str | None, running: list[Sequence]) -> int:
        """Lower tiers' sequences, plus (for a `tenant` at least one sequence below its share of its
        tier) the whole sequences that no more served tenants hold beyond their shares."""
        n = super().displaceable(priority, tenant, running)
        tier = priority if self.tiers else 0
        if tenant is None:
            return n
        excess = self._excess(tier, tenant, running)
        if excess(tenant) > -1:
            return n
        mine = self._standing(tenant)
        tenants = {s.tenant for s in running if self.tier(s) == tier and s.tenant != tenant}
        over = sum(int(excess(t)) for t in tenants if excess(t) >= 1 and self.vtc.value(t) >= mine)
        return n + min(over, int(-excess(tenant)))

    def ahead(self, priority: int, tenant: str | None, waiting: list[Sequence]) -> int:
        """Higher tiers' waiting sequences, and in its own tier (for a `tenant`) only those of
        tenants that VTC serves before it (``least_served``: the smaller counter, on a tie the
        tenant with fewer requests; a tenant new to the queue enters at the least counter of those
        with work, so it ties with the least served and goes first if it holds fewer): a light
        tenant's request does not wait behind a heavy tenant's backlog in the engine's queue."""
        if tenant is None:
            return super().ahead(priority, tenant, waiting)
        tier = priority if self.tiers else 0
        mine = (self._standing(tenant), self.vtc.active.get(tenant, 0) + 1)  # with the new request

        def before(other: str) -> bool:
            return other == tenant or (self.vtc.value(other), self.vtc.active.get(other, 0)) <= mine

        return sum(1 for s in waiting if self.tier(s) > tier or (self.tier(s) == tier and before(s.tenant)))

    def _standing(self, tenant: str) -> float:
        """The counter a new request of `tenant` is compared at: its own while it has work, else
        the least of those with work (where it enters)."""
        if self.vtc.active.get(tenant):
            return self.vtc.value(tenant)
        return min((self.vtc.value(t) for t, k in self.vtc.active.items() if k), default=0.0)

    def _excess(
        self, tier: int, tenant: str, running: list[Sequence] | None = None
    ) -> Callable[[str], float]:
        """tenant -> running sequences of `tier` it holds beyond its weighted share of them (the
        share split between the tier's tenants with work running or waiting, and `tenant`)."""
        held: dict[str, int] = {}
        for s in self._running if running is None else running:
            if self.tier(s) == tier:
                held[s.tenant] = held.get(s.tenant, 0) + 1
        tenants = set(held) | {t for t, h in self.queues.get(tier, {}).items() if h} | {tenant}
        per_weight = sum(held.values()) / sum(self.weights.get(t, 1.0) for t in tenants)
        return lambda t: held.get(t, 0) - per_weight * self.weights.get(t, 1.0)

    def _over_share(self, seq: Sequence, candidates: list[Sequence]) -> Sequence | None:
        """At the sequence cap or the KV limit: the running sequences of seq's tier are shared
        between its tenants with work (running or waiting) in proportion to their weights. If seq's
        tenant holds at least one sequence less than its share and is not more served than a tenant
        holding at least one more than its share, that tenant's sequence with the least progress is
        preempted (cheapest to recompute; it keeps its place in the queue). One swap never reverses
        itself: afterwards neither tenant is a whole sequence away from its share. Without this a
        light tenant waits for a heavy tenant's request to finish before it gets a slot."""
        excess = self._excess(self.tier(seq), seq.tenant)
        if excess(seq.tenant) > -1:
            return None
        mine = self.vtc.value(seq.tenant)
        over = [
            c
            for c in candidates
            if c.tenant != seq.tenant and excess(c.tenant) >= 1 and self.vtc.value(c.tenant) >= mine
        ]
        return min(over, key=lambda c: (-excess(c.tenant),) + progress_lost(c)) if over else None


class VTCPolicy(FairTieredPolicy):
    """Per-tenant fairness by virtual token counters; Sequence.priority is ignored."""

    name = "vtc"
    tiers = False


class PriorityVTCPolicy(FairTieredPolicy):
    """Strict tiers, VTC fairness between the tenants inside each tier."""

    name = "priority+vtc"
