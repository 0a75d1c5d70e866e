"""Published GCRA test vectors, ported to our parameters, run on every backend.

Our rates are per 60 s window with burst = limit, so a vector for "limit L per P" becomes
"limit L per minute" with every duration scaled by 60 s / P. The vectors drive the
tokens-per-minute bucket (a request's tokens = the vector's volume) with an injected clock.
"""

from __future__ import annotations

import pytest

from quotas import Demand, QuotaLimits

START = 1_700_000_000.0  # an arbitrary instant, Unix seconds

# brandur/redis-cell src/cell/mod.rs `it_rate_limits`: limit 5 (max_burst 4), 1 per second.
# Here: limit 5 per minute, so every duration × 12.
# (case, offset ms, volume, remaining, reset_after ms, retry_after ms (-1: none), limited)
REDIS_CELL = [
    (0, 0, 6, 5, 0, -1, True),  # never larger than the maximum: permanent refusal
    (1, 0, 1, 4, 1000, -1, False),
    (2, 0, 1, 3, 2000, -1, False),
    (3, 0, 1, 2, 3000, -1, False),
    (4, 0, 1, 1, 4000, -1, False),
    (5, 0, 1, 0, 5000, -1, False),
    (6, 0, 1, 0, 5000, 1000, True),
    (7, 3000, 1, 2, 3000, -1, False),
    (8, 3100, 1, 1, 3900, -1, False),
    (9, 4000, 1, 1, 4000, -1, False),
    (10, 8000, 1, 4, 1000, -1, False),
    (11, 9500, 1, 4, 1000, -1, False),
    (12, 9500, 0, 4, 1000, -1, False),  # zero volume peeks
    (13, 9500, 2, 2, 3000, -1, False),  # larger volume uses more
    (14, 9500, 5, 2, 3000, 3000, True),  # large requests cannot exceed the limit
]
CELL_SCALE = 12  # 1 s per unit there, 12 s per unit here (60 s / 5)


async def _tpm(limiter, store, limit: int) -> None:
    await store.put("t", QuotaLimits(tokens_per_minute=limit))


async def _ask(limiter, volume: int, at: float):
    return await limiter.admit(Demand("t", prompt_tokens=volume, max_tokens=0), now=at)


async def test_redis_cell_it_rate_limits(limiter, store):
    await _tpm(limiter, store, 5)
    for case, offset_ms, volume, remaining, reset_ms, retry_ms, limited in REDIS_CELL:
        d = await _ask(limiter, volume, START + offset_ms * CELL_SCALE / 1000)
        assert d.allowed is not limited, case
        assert d.tokens.limit == 5, case
        assert d.tokens.remaining == remaining, case
        assert d.tokens.reset_after == pytest.approx(reset_ms * CELL_SCALE / 1000, abs=1e-6), case
        if retry_ms < 0:
            assert d.retry_after is None, case
        else:
            assert d.retry_after == pytest.approx(retry_ms * CELL_SCALE / 1000, abs=1e-6), case
        if limited:
            assert d.limit == "tokens_per_minute" and d.reservation is None, case


# go-redis/redis_rate rate_test.go, limit PerSecond(10) (burst 10): here 10 per minute, so
# every duration × 60. Differences: redis_rate refuses AllowN(1000) with a 99 s retry-after;
# 1000 tokens can never fit in a burst of 10, so we refuse it permanently (retry None).
RATE_SCALE = 60


async def test_redis_rate_allow(limiter, store):
    await _tpm(limiter, store, 10)
    d = await _ask(limiter, 1, START)
    assert (d.allowed, d.tokens.remaining, d.retry_after) == (True, 9, None)
    assert d.tokens.reset_after == pytest.approx(0.1 * RATE_SCALE)
    d = await _ask(limiter, 2, START)
    assert (d.allowed, d.tokens.remaining, d.retry_after) == (True, 7, None)
    assert d.tokens.reset_after == pytest.approx(0.3 * RATE_SCALE)
    d = await _ask(limiter, 1000, START)
    assert (d.allowed, d.tokens.remaining, d.retry_after) == (False, 7, None)
    assert d.tokens.reset_after == pytest.approx(0.3 * RATE_SCALE)


async def test_redis_rate_allow_n_increment_zero(limiter, store):
    await _tpm(limiter, store, 10)
    d = await _ask(limiter, 0, START)  # a row that is not there
    assert (d.allowed, d.tokens.remaining, d.tokens.reset_after) == (True, 10, 0.0)
    d = await _ask(limiter, 1, START)
    assert (d.tokens.remaining, d.tokens.reset_after) == (9, pytest.approx(0.1 * RATE_SCALE))
    d = await _ask(limiter, 0, START)  # peek again
    assert (d.tokens.remaining, d.tokens.reset_after) == (9, pytest.approx(0.1 * RATE_SCALE))


async def test_redis_rate_allow_at_most_sequence(limiter, store):
    """TestAllowAtMost's states, reached with exact AllowN calls (we have no AllowAtMost)."""
    await _tpm(limiter, store, 10)
    steps = [  # (volume, allowed, remaining, reset s, retry s)
        (1, True, 9, 0.1, None),
        (2, True, 7, 0.3, None),
        (0, True, 7, 0.3, None),
        (7, True, 0, 1.0, None),
        (0, True, 0, 1.0, None),
        (1, False, 0, 1.0, 0.1),
    ]
    for volume, allowed, remaining, reset, retry in steps:
        d = await _ask(limiter, volume, START)
        assert (d.allowed, d.tokens.remaining) == (allowed, remaining)
        assert d.tokens.reset_after == pytest.approx(reset * RATE_SCALE)
        assert d.retry_after == (None if retry is None else pytest.approx(retry * RATE_SCALE))


async def test_redis_rate_retry_after_never_exceeds_emission_interval(limiter, store):
    """TestRetryAfter: with a burst of 1, a refusal waits at most one emission interval."""
    await _tpm(limiter, store, 1)
    for i in range(200):
        d = await _ask(limiter, 1, START + i * 0.7)  # 0.7 s apart, interval 60 s
        if not d.allowed:
            assert 0 < d.retry_after <= 60.0
    assert (await _ask(limiter, 1, START + 200 * 0.7 + 60)).allowed


async def test_exact_burst_for_limits_that_do_not_divide_the_window(limiter, store):
    """7/min: the interval is 8.571428… s; a burst admits exactly 7 and refill is exact."""
    await _tpm(limiter, store, 7)
    admitted = [(await _ask(limiter, 1, START)).allowed for _ in range(8)]
    assert admitted == [True] * 7 + [False]
    refused = await _ask(limiter, 1, START)
    assert refused.retry_after == pytest.approx(60 / 7, abs=1e-6)
    assert not (await _ask(limiter, 1, START + 60 / 7 - 1e-6)).allowed
    assert (await _ask(limiter, 1, START + 60 / 7 + 1e-6)).allowed
