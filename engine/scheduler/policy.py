"""The scheduling-policy interface, and FCFS, its reference implementation.

A policy owns the waiting queue. The scheduler (scheduler.py) asks it for the next sequence to
admit, tells it when a sequence is admitted, served, preempted or gone, and asks it to pick a victim
when the KV cache runs out. Every hook the scheduler or a wrapping policy calls is declared here;
where a hook has a body, that body is FCFS's behaviour, so an ordering policy overrides only what
it changes. The policies: FCFS (here), priority tiers (priority.py), per-tenant fairness by virtual
token counters (vtc.py), SLO-aware admission wrapped around any of them (slo.py). registry.py
builds one from its name; none of these modules imports the registry.

Every policy is built as ``cls(config, *, clock=None, inner=None)``: `config` the SchedulerConfig
(default: SchedulerConfig()), `clock` the time source in seconds (default time.monotonic),
`inner` the ordering policy that a wrapping policy (``wraps = True``) delegates its queue to.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Collection, Iterator

from engine.config import SchedulerConfig
from engine.request import Sequence
from engine.scheduler.load import SLOLoad, predict_ttft
from engine.scheduler.plan import StepPlan


class SchedulingPolicy(ABC):
    """The waiting queue plus the decisions that depend on it."""

    name = "abstract"  # its name in the registry (registry.POLICIES)
    wraps = False  # True: delegates its queue to `inner`, an ordering policy ("slo")
    tiers = False  # True: higher `Sequence.priority` first, so only work of a priority or above is ahead

    def __init__(
        self,
        config: SchedulerConfig | None = None,
        *,
        clock: Callable[[], float] | None = None,
        inner: SchedulingPolicy | None = None,
    ) -> None:
        if inner is not None and not self.wraps:
            raise TypeError(
                f"the {self.name!r} scheduling policy orders its own queue: it wraps no other policy"
            )
        self.config = config or SchedulerConfig()
        self.clock = clock or time.monotonic

    # ---- the queue -------------------------------------------------------------------------
    @abstractmethod
    def add(self, seq: Sequence) -> None:
        """A new request arrives. May raise an EngineError to refuse it (nothing is kept)."""

    @abstractmethod
    def add_preempted(self, seq: Sequence) -> None:
        """A preempted sequence returns; it keeps its place ahead of later arrivals."""

    @abstractmethod
    def peek(self) -> Sequence | None:
        """The sequence to admit next, or None."""

    @abstractmethod
    def pop(self) -> Sequence:
        """Remove and return what peek() returned."""

    @abstractmethod
    def remove(self, seq: Sequence) -> bool:
        """Drop a waiting sequence (abort). True if it was waiting."""

    @abstractmethod
    def waiting(self) -> Iterator[Sequence]:
        """Every waiting sequence, in any order (do not add or remove while iterating)."""

    @abstractmethod
    def __len__(self) -> int: ...

    # ---- decisions; the bodies are FCFS's --------------------------------------------------
    def begin_step(self, running: list[Sequence]) -> list[tuple[Sequence, Exception]]:
        """First thing in every step. May reorder `running` in place (earlier ones get their tokens
        first and are preempted last). Returns waiting sequences to refuse now, with the error."""
        return []

    def victim(self, running: list[Sequence]) -> Sequence:
        """Which running sequence to preempt when blocks run out: by default the newest."""
        return running[-1]

    def may_admit(self, seq: Sequence, running: list[Sequence], plan: StepPlan) -> bool:
        """May the head `seq` start in this step (e.g. without pushing running TPOT past target)?"""
        return True

    def displace(
        self,
        seq: Sequence,
        candidates: list[Sequence],
        *,
        for_budget: bool = False,
        plan: StepPlan | None = None,
    ) -> Sequence | None:
        """The waiting head `seq` cannot start: a candidate it may push out, or None. For the token
        budget (`for_budget`) the candidates hold tokens of this step (`plan`, the step so far) and
        the chosen one's are deferred (it keeps its blocks); for the sequence cap or KV blocks it
        is preempted."""
        return None

    def displaceable(self, priority: int, tenant: str | None, running: list[Sequence]) -> int:
        """How many of `running` a new request of `priority` (and `tenant`, if given) arriving now
        could push out at the sequence cap or the KV limit (Scheduler.has_room_for)."""
        return 0

    def ahead(self, priority: int, tenant: str | None, waiting: list[Sequence]) -> int:
        """How many of the `waiting` sequences start before a new request of `priority` (and
        `tenant`, if given) arriving now: under tiers those of its tier or above, else all."""
        return sum(1 for s in waiting if s.priority >= priority or not self.tiers)

    def defers(self, seq: Sequence, other: Sequence) -> bool:
        """May the urgent prefill of `seq` keep `other`'s decode out of its step (with
        config.urgent_prefill_defers_decodes)? It loses nothing but a step."""
        return False

    def urgent(self, seq: Sequence) -> bool:
        """Is seq's prefill latency-critical (then, with config.isolate_urgent_prefill, a step that
        prefills it runs no other prefill beside it)? Called after admission, for prefilling seqs."""
        return False

    def urgent_present(self, running: list[Sequence]) -> bool:
        """Is work of the kind `urgent` names running or waiting (then, with
        config.urgent_step_overhead, steps without an urgent prefill are kept short)?"""
        return False

    def cut_order(self, seq: Sequence) -> tuple:
        """Sort key of the prefill chunks a short step cuts, first cut first: the newest."""
        return (-seq.arrival_time,)

    # ---- accounting ------------------------------------------------------------------------
    def on_scheduled(self, seq: Sequence, num_tokens: int) -> None:
        """seq is computing num_tokens this step (service accounting for fairness policies);
        called once per scheduled sequence after the step's plan is final."""

    def on_finished(self, seq: Sequence) -> None:
        """seq left the engine (finished, aborted or refused), from the queue or from running."""

    def observe(self, plan: StepPlan, seconds: float) -> None:
        """The step of `plan` took `seconds` (feeds step-cost models)."""

    # ---- latency prediction: None for a policy that keeps no step-cost model ----------------
    def load(self, running: Collection[Sequence] = ()) -> SLOLoad | None:
        """What predict_ttft reads right now, as plain numbers (load.py), or None."""
        return None

    def predict_ttft(
        self,
        num_prompt_tokens: int,
        priority: int = 0,
        running: Collection[Sequence] = (),
        waited: float = 0.0,
    ) -> float | None:
        """Seconds from now to the first token of a request of `priority` with this many prompt
        tokens still to compute, if it arrived now (plus `waited`, time it has already waited);
        None when load() is None."""
        load = self.load(running)
        return None if load is None else predict_ttft(load, num_prompt_tokens, priority, waited=waited)


class FCFSPolicy(SchedulingPolicy):
    """First come, first served: one FIFO; a preempted sequence goes back to its front."""

    name = "fcfs"

    def __init__(
        self,
        config: SchedulerConfig | None = None,
        *,
        clock: Callable[[], float] | None = None,
        inner: SchedulingPolicy | None = None,
    ) -> None:
        super().__init__(config, clock=clock, inner=inner)
        self.queue: deque[Sequence] = deque()

    def add(self, seq: Sequence) -> None:
        self.queue.append(seq)

    def add_preempted(self, seq: Sequence) -> None:
        self.queue.appendleft(seq)

    def peek(self) -> Sequence | None:
        return self.queue[0] if self.queue else None

    def pop(self) -> Sequence:
        return self.queue.popleft()

    def remove(self, seq: Sequence) -> bool:
        try:
            self.queue.remove(seq)
        except ValueError:
            return False
        return True

    def waiting(self) -> Iterator[Sequence]:
        return iter(self.queue)

    def __len__(self) -> int:
        return len(self.queue)
