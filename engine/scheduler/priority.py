"""Strict priority tiers: the tiered queue that the priority and the VTC policies share.

Waiting sequences sit in tier -> tenant -> heap ordered by arrival. `peek` takes the highest tier
with work (strict priority: a higher `Sequence.priority` number is more important), and inside it
one tenant's oldest sequence: here the tier is one FIFO (a single tenant key); the VTC policies
(vtc.py) key by tenant and choose the least-served one. A preempted sequence returns under its
original arrival time, so it is ahead of every later arrival of its tier.

Starvation guard: a minimum share. Every tier's served tokens are kept as a decayed sum (a window
of ~1/(1-DECAY) steps); a tier backlogged for a whole window whose share of it is below
`config.tier_min_share` is served first and its running sequences are not displaced, until it is
back above its share. A waiting head displaces running sequences of lower tiers (preempted, or for
the token budget its tokens of this step deferred).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator

from engine.config import SchedulerConfig
from engine.request import Sequence
from engine.scheduler.plan import StepPlan
from engine.scheduler.policy import SchedulingPolicy

DECAY = 0.98  # per step, for the served-tokens window of the starvation guard
WINDOW = 50  # steps, ~1 / (1 - DECAY): a tier must be backlogged this long to count as starving


def progress_lost(seq: Sequence) -> tuple:
    """Preemption order inside a tier: least computed work first (cheapest to recompute), newest first."""
    return (seq.num_computed_tokens, -seq.arrival_time)


class TieredPolicy(SchedulingPolicy):
    """Tiers (if `tiers`) of per-tenant heaps; FIFO inside a tier. Subclasses choose the tenant
    (`_tenant`, `_choose_tenant`) and may displace inside a tier (`_displace_in_tier`)."""

    tiers = True

    def __init__(
        self,
        config: SchedulerConfig | None = None,
        *,
        clock: Callable[[], float] | None = None,
        inner: SchedulingPolicy | None = None,
    ) -> None:
        super().__init__(config, clock=clock, inner=inner)
        self.min_share = self.config.tier_min_share if self.tiers else 0.0
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
        """The heap key inside a tier: one FIFO per tier here."""
        return ""

    def _choose_tenant(self, heaps: dict[str, list]) -> str:
        """Which of a tier's non-empty heaps (tenant -> heap) gives the next sequence."""
        return next(iter(heaps))

    # ---- queue -----------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
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
            self._head = heaps[self._choose_tenant(heaps)][0][2]
        return self._head

    def pop(self) -> Sequence:
        seq = self.peek()
        assert seq is not None, "pop from an empty queue"
        heapq.heappop(self.queues[self.tier(seq)][self._tenant(seq)])
        self._len -= 1
        self._head = None
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

    def waiting(self) -> Iterator[Sequence]:
        for tenants in self.queues.values():
            for heap in tenants.values():
                for entry in heap:
                    yield entry[2]

    def __len__(self) -> int:
        return self._len

    # ---- accounting ------------------------------------------------------------------------
    def begin_step(self, running: list[Sequence]) -> list[tuple[Sequence, Exception]]:
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
        return []

    def on_scheduled(self, seq: Sequence, num_tokens: int) -> None:
        self.served[self.tier(seq)] = self.served.get(self.tier(seq), 0.0) + num_tokens

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
        return (
            bool(self.min_share) and waited >= WINDOW and self.served.get(tier, 0.0) < self.min_share * total
        )

    def _victim_key(self, seq: Sequence) -> tuple:
        """Lowest tier first, then least progress lost."""
        return (self.tier(seq),) + progress_lost(seq)

    def cut_order(self, seq: Sequence) -> tuple:
        return self._victim_key(seq)

    def victim(self, running: list[Sequence]) -> Sequence:
        return min(running, key=self._victim_key)

    def displace(
        self,
        seq: Sequence,
        candidates: list[Sequence],
        *,
        for_budget: bool = False,
        plan: StepPlan | None = None,
    ) -> Sequence | None:
        """A lower tier is pushed out first (preempted, or for the budget its tokens deferred);
        then `_displace_in_tier` may choose one of seq's own tier."""
        mine = self.tier(seq)
        out = [c for c in candidates if self.tier(c) < mine and not self._protected(self.tier(c))]
        if out:
            return min(out, key=self._victim_key)
        same = [c for c in candidates if self.tier(c) == mine]
        return self._displace_in_tier(seq, same, for_budget, plan)

    def _displace_in_tier(
        self, seq: Sequence, same: list[Sequence], for_budget: bool, plan: StepPlan | None
    ) -> Sequence | None:
        """Inside a tier nobody is displaced here (FIFO)."""
        return None

    def displaceable(self, priority: int, tenant: str | None, running: list[Sequence]) -> int:
        """Running sequences of lower tiers that are not protected by the starvation guard."""
        mine = priority if self.tiers else 0
        return sum(1 for s in running if self.tier(s) < mine and not self._protected(self.tier(s)))

    def defers(self, seq: Sequence, other: Sequence) -> bool:
        """A lower tier's decode, unless the starvation guard protects that tier."""
        return self.tier(other) < self.tier(seq) and not self._protected(self.tier(other))

    def urgent(self, seq: Sequence) -> bool:
        """A prefill is urgent when lower tiers have work (running or waiting)."""
        tier = self.tier(seq)
        return self.tiers and (
            any(self.tier(s) < tier for s in self._running)
            or any(t < tier and any(q.values()) for t, q in self.queues.items())
        )

    def urgent_present(self, running: list[Sequence]) -> bool:
        """Two tiers have work (running or waiting): the higher one's prefills are urgent."""
        tiers = {self.tier(s) for s in running} | {t for t, q in self.queues.items() if any(q.values())}
        return self.tiers and len(tiers) > 1


class PriorityPolicy(TieredPolicy):
    """Strict priority tiers, FIFO (by arrival) inside a tier, preemption of lower tiers."""

    name = "priority"
