"""The Lua GCRA against an exact model in Python's Fractions, on random workloads.

Limits that do not divide the window (7, 13, 977, 90_001 per minute) make the emission
interval a non-integer number of µs; the scripts keep it exact with an integer remainder, so
every answer must equal the rational model's, to the µs.
"""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest

from quotas import Demand, QuotaLimits

WINDOW = 60_000_000  # µs
START_US = 1_700_000_000_000_000


class Model:
    """GCRA with burst = limit, in exact rational µs."""

    def __init__(self, limit: int) -> None:
        self.limit, self.tat = limit, Fraction(0)

    def step(self, now: int, n: int):
        """(allowed, remaining, reset µs, retry µs or None) for n units at now."""
        tat = max(self.tat, Fraction(now))
        new = tat + Fraction(n * WINDOW, self.limit)
        allowed = n <= self.limit and new - now <= WINDOW
        retry = None
        if allowed:
            self.tat = tat = new
        elif n <= self.limit:
            retry = math.ceil(new - now - WINDOW)
        d = tat - now
        return allowed, math.floor((WINDOW - d) * self.limit / WINDOW), math.ceil(d), retry


@pytest.mark.parametrize("limit", [1, 7, 13, 977, 90_001])
async def test_lua_gcra_equals_the_rational_model(store, limiter, limit):
    await store.put("m", QuotaLimits(tokens_per_minute=limit))
    model, rng, now = Model(limit), random.Random(limit), START_US
    interval, seen = WINDOW / limit, set()
    for _ in range(120):
        now += int(rng.expovariate(1.0) * interval * rng.choice([0.3, 1, 3]))
        n = rng.choice([0, 1, 1, 2, max(1, limit // 3), limit, limit + 1])
        d = await limiter.admit(Demand("m", prompt_tokens=n, max_tokens=0), now=now / 1e6)
        allowed, remaining, reset_us, retry_us = model.step(now, n)
        seen.add((allowed, retry_us is None))
        assert d.allowed == allowed
        assert d.tokens.remaining == remaining
        assert round(d.tokens.reset_after * 1e6) == reset_us
        if not allowed:
            assert (None if d.retry_after is None else round(d.retry_after * 1e6)) == retry_us
    assert seen == {(True, True), (False, False), (False, True)}  # admitted, wait, never
