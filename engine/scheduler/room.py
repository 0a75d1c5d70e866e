"""How many more requests would start at the next step: what a worker asks once before it reads its
lanes, so that it takes every entry that fits in one read per lane instead of asking per entry.

``Room.count`` is what ``Scheduler.has_room_for`` answers when asked again after each request added
one by one, for requests of the smallest size (a one-token prompt: one KV block, with the first
output slot). A larger prompt holds more blocks, so the count is an upper bound on what the one by
one loop would take; the engine keeps any excess waiting, in its policy's order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

FRESH_TENANT = "\x00fresh"  # a tenant no request carries: one that holds nothing (Room.fresh)


@dataclass(frozen=True)
class Room:
    """``free``: requests that start without displacing anyone (the sequence cap, the KV blocks).
    ``displacing[p]``: requests of priority ``p`` that start by pushing out running work the policy
    lets them displace, beyond those waiting at ``p`` or above (every waiting one when the policy
    has no tiers). ``tiers``: the policy orders by priority. ``tenants[p][t]``: the same for a
    request of tenant ``t``, one of those holding sequences of ``p``'s tier, and ``fresh[p]`` for
    any other tenant: under VTC a tenant below its share also displaces what more-served tenants
    hold beyond theirs, so a worker takes a light tenant's entry while a heavy one holds every slot.
    ``tokens``: the next step's token budget left for prompts not in the engine yet (None: no bound;
    Scheduler._prompt_tokens_left says when there is one); ``free`` counts only while it is above 0."""

    free: int
    displacing: Mapping[int, int]
    tiers: bool
    fresh: Mapping[int, int] = field(default_factory=dict)
    tenants: Mapping[int, Mapping[str, int]] = field(default_factory=dict)
    tokens: int | None = None

    @property
    def open(self) -> int:
        """``free``, or 0 once the next step's token budget is spent."""
        return self.free if self.tokens is None or self.tokens > 0 else 0

    def count(self, priority: int, taken: Iterable[int] = (), tenant: str | None = None) -> int:
        """How many more of ``priority`` (of ``tenant``, if given) would start once requests of the
        priorities ``taken`` were added (each of them fills a slot, and waits ahead of ``priority``
        if at or above it)."""
        room = self.after(taken)
        n = max(0, room.open, room.displacing.get(priority, 0))
        if tenant is None:
            return n
        return max(n, room.tenants.get(priority, {}).get(tenant, room.fresh.get(priority, 0)))

    def most(self, priority: int) -> int:
        """The largest ``count`` of ``priority`` over every tenant: whether a lane is worth reading."""
        by_tenant = [self.fresh.get(priority, 0), *self.tenants.get(priority, {}).values()]
        return max(self.count(priority), *by_tenant)

    def after(self, taken: Iterable[int], tokens: int = 0) -> Room:
        """The room left once requests of the priorities ``taken`` were added (``tokens``: their
        prompts' tokens)."""
        taken = list(taken)

        def less(counts: Mapping[int, int]) -> dict[int, int]:
            return {p: d - sum(1 for t in taken if t >= p or not self.tiers) for p, d in counts.items()}

        tenants = {
            p: {t: d - sum(1 for x in taken if x >= p or not self.tiers) for t, d in counts.items()}
            for p, counts in self.tenants.items()
        }
        left = None if self.tokens is None else self.tokens - tokens
        return Room(
            self.free - len(taken), less(self.displacing), self.tiers, less(self.fresh), tenants, left
        )
