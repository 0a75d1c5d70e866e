"""Scheduling policies: who waits in which order and who is preempted first.

A policy owns the waiting queue. The scheduler asks it for the next sequence to admit, tells it
when a sequence is admitted, served or preempted, and asks it to pick a victim when the KV cache
runs out. The policies beyond FCFS (tiered.py: priority tiers and per-tenant VTC fairness; slo.py:
SLO-aware admission) use the extra hooks below, whose defaults leave FCFS's behaviour unchanged.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from typing import Callable

from engine.request import Sequence

POLICIES: dict[str, type["SchedulingPolicy"]] = {}


def register_policy(name: str) -> Callable[[type], type]:
    def wrap(cls: type) -> type:
        POLICIES[name] = cls
        cls.name = name
        return cls

    return wrap


def make_policy(name: str, config=None, clock: Callable[[], float] | None = None) -> "SchedulingPolicy":
    """Build a policy by name. Names compose with "+": "priority+vtc" is tiers with fairness inside
    each tier; "+slo" wraps any of them in SLO-aware admission (e.g. "priority+vtc+slo").
    `config` is the SchedulerConfig; `clock` the time source of SLO policies (default monotonic)."""
    import engine.scheduler.slo  # noqa: F401  (registers the policies beyond FCFS)
    import engine.scheduler.tiered  # noqa: F401

    parts = name.split("+")
    if "slo" in parts and len(parts) > 1:
        inner = make_policy("+".join(p for p in parts if p != "slo"), config, clock)
        return POLICIES["slo"](config, clock=clock, inner=inner)
    key = "+".join(sorted(parts, key=lambda p: ("priority", "vtc").index(p) if p in ("priority", "vtc") else 9))
    try:
        cls = POLICIES[key]
    except KeyError:
        raise ValueError(f"unknown scheduling policy {name!r}; known: {sorted(POLICIES)} "
                         "(compose with '+', e.g. 'priority+vtc+slo')") from None
    return cls(config, clock=clock) if key == "slo" else cls(config)


class SchedulingPolicy(ABC):
    """The waiting queue plus the decisions that depend on it."""

    name = "abstract"

    @abstractmethod
    def add(self, seq: Sequence) -> None:
        """A new request arrives."""

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
    def __len__(self) -> int: ...

    def victim(self, running: list[Sequence]) -> Sequence:
        """Which running sequence to preempt when blocks run out: by default the newest."""
        return running[-1]

    def on_scheduled(self, seq: Sequence, num_tokens: int) -> None:
        """seq is computing num_tokens this step (service accounting for fairness policies);
        called once per scheduled sequence after the step's plan is final."""

    # ---- hooks of the policies beyond FCFS; the defaults change nothing ------------------
    def begin_step(self, running: list[Sequence]) -> list[tuple[Sequence, Exception]]:
        """First thing in every step. May reorder `running` in place (earlier ones get their tokens
        first and are preempted last). Returns waiting sequences to refuse now, with the error."""
        return []

    def may_admit(self, seq: Sequence, running: list[Sequence], plan) -> bool:
        """May the head `seq` start in this step (e.g. without pushing running TPOT past target)?"""
        return True

    def displace(self, seq: Sequence, candidates: list[Sequence], *, for_budget: bool = False,
                 plan=None) -> Sequence | None:
        """The waiting head `seq` cannot start: a candidate it may push out, or None. For the token
        budget (`for_budget`) the candidates hold tokens of this step (`plan`, the step so far) and
        the chosen one's are deferred (it keeps its blocks); for the sequence cap or KV blocks it
        is preempted."""
        return None

    def urgent(self, seq: Sequence) -> bool:
        """Is seq's prefill latency-critical (then, with config.isolate_urgent_prefill, a step that
        prefills it runs no other prefill beside it)? Called after admission, for prefilling seqs."""
        return False

    def on_finished(self, seq: Sequence) -> None:
        """seq left the engine (finished, aborted or refused), from the queue or from running."""

    def observe(self, plan, seconds: float) -> None:
        """The step of `plan` took `seconds` (feeds step-cost models)."""


@register_policy("fcfs")
class FCFSPolicy(SchedulingPolicy):
    """First come, first served."""

    def __init__(self, config=None) -> None:
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

    def __len__(self) -> int:
        return len(self.queue)
