"""Priority tiers and per-tenant fairness (virtual token counters), as one composable queue.

Waiting sequences sit in tier -> tenant -> heap ordered by arrival. `peek` takes the highest tier
with work (strict priority: a higher `Sequence.priority` number is more important), and inside it
the tenant with the smallest virtual token counter (VTC, Sheng et al., OSDI'24) or, without
fairness, one FIFO per tier. A preempted sequence returns under its original arrival time, so it
is ahead of every later arrival of its tier.

Starvation guard: a minimum share. Every tier's served tokens are kept as a decayed sum (a window
of ~1/(1-DECAY) steps); a tier backlogged for a whole window whose share of it is below
`config.tier_min_share` is served first and its running sequences are not displaced, until it is
back above its share. The policies registered here: "priority", "vtc", "priority+vtc".
"""
from __future__ import annotations

import heapq
import itertools

from engine.config import SchedulerConfig
from engine.request import Sequence
from engine.scheduler.policy import SchedulingPolicy, register_policy
from engine.scheduler.vtc import VirtualTokenCounters

DECAY = 0.98  # per step, for the served-tokens window of the starvation guard
WINDOW = 50  # steps, ~1 / (1 - DECAY): a tier must be backlogged this long to count as starving


def progress_lost(seq: Sequence) -> tuple:
    """Preemption order inside a tier: least computed work first (cheapest to recompute), newest first."""
    return (seq.num_computed_tokens, -seq.arrival_time)


class TieredPolicy(SchedulingPolicy):
    """Tiers (if `tiers`) with a FIFO or VTC order (if `fair`) inside each tier."""

    tiers = True
    fair = False

    def __init__(self, config: SchedulerConfig | None = None):
        config = config or SchedulerConfig()
        self.min_share = config.tier_min_share if self.tiers else 0.0
        self.step_budget = config.max_num_batched_tokens
        self.weights: dict[str, float] = {}  # tenant -> its weight (latest request's)
        self.vtc = VirtualTokenCounters(config.vtc_input_weight, config.vtc_output_weight) if self.fair else None
        self.queues: dict[int, dict[str, list]] = {}  # tier -> tenant -> heap of (arrival, n, seq)
        self.served: dict[int, float] = {}  # tier -> decayed tokens served
        self._count = itertools.count()
        self._len = 0
        self._head: Sequence | None = None
        self._step = 0
        self._running: list[Sequence] = []  # the scheduler's running list, seen at begin_step
        self._since: dict[int, int] = {}  # tier -> step since which it has had waiting work

    # ---- keys ------------------------------------------------------------------------------
    def tier(self, seq: Sequence) -> int:
        return seq.priority if self.tiers else 0

    def _tenant(self, seq: Sequence) -> str:
        return seq.tenant if self.fair else ""

    # ---- queue -----------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        if self.vtc is not None:
            self.vtc.arrive(seq)
            self.weights[seq.tenant] = seq.weight
        self._push(seq)

    def add_preempted(self, seq: Sequence) -> None:
        self._push(seq)

    def _push(self, seq: Sequence) -> None:
        heap = self.queues.setdefault(self.tier(seq), {}).setdefault(self._tenant(seq), [])
        heapq.heappush(heap, (seq.arrival_time, next(self._count), seq))
        self._len += 1
        self._head = None

    def peek(self) -> Sequence | None:
        if self._head is None and self._len:
            tier = self._starving_tier()
            if tier is None:
                tier = max(t for t, q in self.queues.items() if any(q.values()))
            heaps = {tenant: h for tenant, h in self.queues[tier].items() if h}
            tenant = self.vtc.least_served(heaps) if self.vtc is not None else next(iter(heaps))
            self._head = heaps[tenant][0][2]
        return self._head

    def pop(self) -> Sequence:
        seq = self.peek()
        heapq.heappop(self.queues[self.tier(seq)][self._tenant(seq)])
        self._len -= 1
        self._head = None
        if self.vtc is not None:
            self.vtc.admitted(seq)
        return seq

    def remove(self, seq: Sequence) -> bool:
        heap = self.queues.get(self.tier(seq), {}).get(self._tenant(seq), [])
        for i, entry in enumerate(heap):
            if entry[2] is seq:
                heap.pop(i)
                heapq.heapify(heap)
                self._len -= 1
                self._head = None
                return True
        return False

    def __len__(self) -> int:
        return self._len

    def waiting(self):
        """Every waiting sequence (any order)."""
        for tenants in self.queues.values():
            for heap in tenants.values():
                for entry in heap:
                    yield entry[2]

    # ---- accounting ------------------------------------------------------------------------
    def begin_step(self, running: list[Sequence]) -> list:
        self._step += 1
        self._running = running
        total = sum(self.served.values())
        for t, q in self.queues.items():  # a tier stays "starving" until it has had its share
            if not any(q.values()) and self.served.get(t, 0.0) >= self.min_share * total:
                self._since.pop(t, None)
        for t in self.served:
            self.served[t] *= DECAY
        if self.tiers:  # higher tiers get their tokens first and are preempted last (stable sort)
            running.sort(key=lambda s: -s.priority)
        self._head = None  # counters and shares moved since the last peek
        if self.vtc is not None:
            self.vtc.begin_step()
        return []

    def on_scheduled(self, seq: Sequence, num_tokens: int) -> None:
        self.served[self.tier(seq)] = self.served.get(self.tier(seq), 0.0) + num_tokens
        if self.vtc is not None:
            self.vtc.served(seq, num_tokens)

    def on_finished(self, seq: Sequence) -> None:
        if self.vtc is not None:
            self.vtc.left(seq)

    # ---- the starvation guard and preemption -----------------------------------------------
    def _starving_tier(self) -> int | None:
        """The highest backlogged tier below the top one that has waited a whole window and got
        less than its minimum share of the window's served tokens."""
        total = sum(self.served.values())
        if not self.min_share or total <= 0:
            return None
        backlogged = sorted((t for t, q in self.queues.items() if any(q.values())), reverse=True)
        for t in backlogged[1:]:  # the top backlogged tier is served anyway
            waited = self._step - self._since.setdefault(t, self._step)
            if waited >= WINDOW and self.served.get(t, 0.0) < self.min_share * total:
                return t
        return None

    def _protected(self, tier: int) -> bool:
        """A tier below its share after waiting a whole window keeps its running sequences."""
        total = sum(self.served.values())
        waited = self._step - self._since.get(tier, self._step)
        return bool(self.min_share) and waited >= WINDOW and self.served.get(tier, 0.0) < self.min_share * total

    def _victim_key(self, seq: Sequence) -> tuple:
        """Lowest tier first; with fairness the most-served tenant inside it; then least progress lost."""
        served = -self.vtc.counters.get(seq.tenant, 0.0) if self.vtc is not None else 0.0
        return (self.tier(seq), served) + progress_lost(seq)

    def victim(self, running: list[Sequence]) -> Sequence:
        return min(running, key=self._victim_key)

    def displace(self, seq: Sequence, candidates: list[Sequence], *, for_budget: bool = False,
                 plan=None) -> Sequence | None:
        """A lower tier is pushed out first (preempted, or for the budget its tokens deferred).
        Inside a tier, with fairness, a less-served tenant may defer a more-served tenant's tokens
        of this step (`_more_served`) and, at the sequence cap or the KV limit, preempt one of the
        sequences a tenant holds beyond its weighted share (`_over_share`)."""
        mine = self.tier(seq)
        out = [c for c in candidates if self.tier(c) < mine and not self._protected(self.tier(c))]
        if out:
            return min(out, key=self._victim_key)
        if self.vtc is None:
            return None
        same = [c for c in candidates if self.tier(c) == mine]
        return self._more_served(seq, same, plan) if for_budget else self._over_share(seq, same)

    def _more_served(self, seq: Sequence, candidates: list[Sequence], plan) -> Sequence | None:
        """For the token budget: a running sequence of a tenant that stays at least as served as
        seq's tenant even once seq's remaining prompt is counted (so the two never trade places
        back and forth within a step; this keeps VTC's 2U bound), from the most-served such tenant,
        its largest chunk of this step first. Its tokens wait one step; it loses no work. Without
        this a light tenant's prompt is split behind a heavy tenant's decodes and chunks and its
        first token comes a step or two later than it would alone."""
        mine = self.vtc.value(seq.tenant) + self.vtc.w_in * (seq.num_tokens - seq.num_computed_tokens) / seq.weight
        over = [c for c in candidates if c.tenant != seq.tenant and self.vtc.value(c.tenant) >= mine]
        if not over:
            return None
        chunk = {id(item.seq): item.num_tokens for item in plan.scheduled} if plan is not None else {}
        return max(over, key=lambda c: (self.vtc.value(c.tenant), chunk.get(id(c), 0), -c.arrival_time))

    def urgent(self, seq: Sequence) -> bool:
        """A prefill is urgent when lower tiers have work (running or waiting) or, with fairness,
        when its tenant holds at least one sequence less than its weighted share of its tier."""
        tier = self.tier(seq)
        if self.tiers:
            lower = any(self.tier(s) < tier for s in self._running) or any(
                t < tier and any(q.values()) for t, q in self.queues.items())
            if lower:
                return True
        return self.vtc is not None and self._excess(tier, seq.tenant)(seq.tenant) <= -1

    def _excess(self, tier: int, tenant: str):
        """tenant -> running sequences of `tier` it holds beyond its weighted share of them (the
        share split between the tier's tenants with work running or waiting, and `tenant`)."""
        held: dict[str, int] = {}
        for s in self._running:
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
        over = [c for c in candidates if c.tenant != seq.tenant and excess(c.tenant) >= 1
                and self.vtc.value(c.tenant) >= mine]
        return min(over, key=lambda c: (-excess(c.tenant),) + progress_lost(c)) if over else None


@register_policy("priority")
class PriorityPolicy(TieredPolicy):
    """Strict priority tiers, FIFO (by arrival) inside a tier, preemption of lower tiers."""


@register_policy("vtc")
class VTCPolicy(TieredPolicy):
    """Per-tenant fairness by virtual token counters; Sequence.priority is ignored."""

    tiers = False
    fair = True


@register_policy("priority+vtc")
class PriorityVTCPolicy(TieredPolicy):
    """Strict tiers, VTC fairness between the tenants inside each tier."""

    fair = True
