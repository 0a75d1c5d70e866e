"""Exactness under concurrency: 2 processes × 200 concurrent admissions against one limit.

Each process is a separate interpreter with its own client and connection pool, like two
gateway replicas. A limit of N per minute must admit exactly N, never N+1. Runs on every
backend, with Redis's own clock (N small enough that no refill happens during the contest)
and with a frozen injected clock (N large).
"""

from __future__ import annotations

import multiprocessing
import random

import pytest

import quota_contest
from quotas import QuotaLimits

PROCESSES, PER_PROCESS = 2, 200
START = 1_700_000_000.0

# clock → (N, injected now). With TIME, 60 s / 10 = 6 s between refills: the contest is over
# long before, so anything above 10 would be a real over-admission.
CLOCKS = {"redis-time": (10, None), "frozen": (150, START)}


def contest(backend, keyspace, sizes_per_process, now) -> list[tuple[bool, str | None, int]]:
    """Run the contest in separate processes; every process's decisions, concatenated."""
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(PROCESSES), ctx.Queue()
    procs = [
        ctx.Process(target=quota_contest.run,
                    args=(backend.url, keyspace.prefix, sizes, now, barrier, results))
        for sizes in sizes_per_process
    ]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=60) for _ in procs]
    errors = [o for o in outcomes if isinstance(o, str)]
    assert not errors, errors
    for p in procs:
        p.join(timeout=10)
        assert p.exitcode == 0
    return [o for outcome in outcomes for o in outcome]


@pytest.mark.parametrize("clock", CLOCKS)
async def test_requests_per_minute_admits_exactly_n(backend, keyspace, store, clock):
    n, now = CLOCKS[clock]
    await store.put("contested", QuotaLimits(requests_per_minute=n))
    sizes = [[(10, 10)] * PER_PROCESS for _ in range(PROCESSES)]
    outcomes = contest(backend, keyspace, sizes, now)
    assert len(outcomes) == PROCESSES * PER_PROCESS
    assert sum(allowed for allowed, _, _ in outcomes) == n
    assert {limit for allowed, limit, _ in outcomes if not allowed} == {"requests_per_minute"}
    usage = await store.usage("contested", now=now)
    assert usage.requests.remaining == 0


@pytest.mark.parametrize("clock", CLOCKS)
async def test_tokens_per_minute_admits_exactly_n(backend, keyspace, store, clock):
    n, now = CLOCKS[clock]
    cost = 100  # 40 prompt + 60 max_tokens reserved per request
    await store.put("contested", QuotaLimits(tokens_per_minute=n * cost))
    sizes = [[(40, 60)] * PER_PROCESS for _ in range(PROCESSES)]
    outcomes = contest(backend, keyspace, sizes, now)
    admitted = [tokens for allowed, _, tokens in outcomes if allowed]
    assert len(admitted) == n and sum(admitted) == n * cost
    assert {limit for allowed, limit, _ in outcomes if not allowed} == {"tokens_per_minute"}
    usage = await store.usage("contested", now=now)
    assert usage.tokens.remaining < cost  # refilled since (Redis clock) by < one request


async def test_tokens_of_mixed_sizes_fill_the_limit_without_overshoot(backend, keyspace, store):
    """Frozen clock, random sizes: the charged sum never exceeds the limit, Redis's state
    equals the sum of admitted reservations (no lost update), and nothing was refused that
    would still have fit."""
    limit = 20_000
    await store.put("contested", QuotaLimits(tokens_per_minute=limit))
    rng = random.Random(4)
    sizes = [[(rng.randint(1, 150), rng.randint(0, 150)) for _ in range(PER_PROCESS)]
             for _ in range(PROCESSES)]
    outcomes = contest(backend, keyspace, sizes, START)
    charged = sum(tokens for allowed, _, tokens in outcomes if allowed)
    refused = [tokens for allowed, _, tokens in outcomes if not allowed]
    assert charged <= limit and refused
    usage = await store.usage("contested", now=START)
    assert usage.tokens.remaining == limit - charged
    assert min(refused) > limit - charged


async def test_concurrency_leases_admit_exactly_n(backend, keyspace, store):
    """Nothing settles during the contest: exactly N leases are handed out."""
    n = 25
    await store.put("contested", QuotaLimits(max_concurrency=n))
    outcomes = contest(backend, keyspace, [[(1, 1)] * PER_PROCESS] * PROCESSES, None)
    assert sum(allowed for allowed, _, _ in outcomes) == n
    assert {limit for allowed, limit, _ in outcomes if not allowed} == {"concurrency"}
    assert (await store.usage("contested")).in_flight == n
