"""Scheduling policies: who waits in which order and who is preempted first.

A policy owns the waiting queue. The scheduler asks it for the next sequence to admit, tells it
when a sequence is admitted, served or preempted, and asks it to pick a victim when the KV cache
runs out. Later policies (priority tiers, per-tenant fairness, SLO admission) plug in through the
registry below.
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


def make_policy(name: str) -> "SchedulingPolicy":
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown scheduling policy {name!r}; known: {sorted(POLICIES)}") from None


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
        """seq is computing num_tokens this step (service accounting for fairness policies)."""


@register_policy("fcfs")
class FCFSPolicy(SchedulingPolicy):
    """First come, first served."""

    def __init__(self) -> None:
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
