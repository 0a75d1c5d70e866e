"""Exactness under concurrency: 2 processes × 200 concurrent admissions against one limit.

Each process is a separate interpreter with its own client and connection pool, like two
gateway replicas. A limit of N per minute must admit exactly N, never N+1. Runs on every
backend, with Redis's own clock (N small enough that no refill happens during the contest)
and with a frozen injected clock (N large).
"""

from __future__ import annotations

import multiprocessing
import os
import random
import sys

import pytest

from quotas import QuotaLimits

# Spawned processes import the contest by module name; make that work in any import mode.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import quota_contest  # noqa: E402

pytestmark = pytest.mark.timeout(180)

PROCESSES, PER_PROCESS = 2, 200
START = 1_700_000_000.0

# clock → (N, injected now). With TIME, 60 s / 10 = 6 s between refills: the contest is over
# long before, so anything above 10 would be a real over-admission.
CLOCKS = {"redis-time": (10, None), "frozen": (150, START)}


@pytest.fixture(scope="module")
def contestants():
    """Two long-lived spawned processes, each with its own job and result queues."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES)
    queues = [(ctx.Queue(), ctx.Queue()) for _ in range(PROCESSES)]
    procs = [
        ctx.Process(target=quota_contest.serve, args=(jobs, results, barrier), daemon=True)
        for jobs, results in queues
    ]
    for p in procs:
        p.start()
    yield queues
    for (jobs, _), p in zip(queues, procs):
        jobs.put(None)
        p.join(timeout=10)


@pytest.fixture
def contest(contestants, backend, keyspace):
    """Run one contest: process i fires sizes_per_process[i]; all decisions, concatenated."""

    def run(sizes_per_process, now) -> list[tuple[bool, str | None, int]]:
        for (jobs, _), sizes in zip(contestants, sizes_per_process):
            jobs.put((backend.url, keyspace.prefix, sizes, now))
        outcomes = [results.get(timeout=60) for _, results in contestants]
        errors = [o for o in outcomes if isinstance(o, str)]
        assert not errors, errors
        return [o for outcome in outcomes for o in outcome]

    return run


@pytest.mark.parametrize("clock", CLOCKS)
async def test_requests_per_minute_admits_exactly_n(contest, store, clock):
    n, now = CLOCKS[clock]
    await store.put("contested", QuotaLimits(requests_per_minute=n))
    sizes = [[(10, 10)] * PER_PROCESS for _ in range(PROCESSES)]
    outcomes = contest(sizes, now)
    assert len(outcomes) == PROCESSES * PER_PROCESS
    assert sum(allowed for allowed, _, _ in outcomes) == n
    assert {limit for allowed, limit, _ in outcomes if not allowed} == {"requests_per_minute"}
    usage = await store.usage("contested", now=now)
    assert usage.requests.remaining == 0


@pytest.mark.parametrize("clock", CLOCKS)
async def test_tokens_per_minute_admits_exactly_n(contest, store, clock):
    n, now = CLOCKS[clock]
    cost = 100  # 40 prompt + 60 max_tokens reserved per request
    await store.put("contested", QuotaLimits(tokens_per_minute=n * cost))
    sizes = [[(40, 60)] * PER_PROCESS for _ in range(PROCESSES)]
    outcomes = contest(sizes, now)
    admitted = [tokens for allowed, _, tokens in outcomes if allowed]
    assert len(admitted) == n and sum(admitted) == n * cost
    assert {limit for allowed, limit, _ in outcomes if not allowed} == {"tokens_per_minute"}
    usage = await store.usage("contested", now=now)
    assert usage.tokens.remaining < cost  # refilled since (Redis clock) by < one request


async def test_tokens_of_mixed_sizes_fill_the_limit_without_overshoot(contest, store):
    """Frozen clock, random sizes: the charged sum never exceeds the limit, Redis's state
    equals the sum of admitted reservations (no lost update), and nothing was refused that
    would still have fit."""
    limit = 20_000
    await store.put("contested", QuotaLimits(tokens_per_minute=limit))
    rng = random.Random(4)
    sizes = [
        [(rng.randint(1, 150), rng.randint(0, 150)) for _ in range(PER_PROCESS)] for _ in range(PROCESSES)
    ]
    outcomes = contest(sizes, START)
    charged = sum(tokens for allowed, _, tokens in outcomes if allowed)
    refused = [tokens for allowed, _, tokens in outcomes if not allowed]
    assert charged <= limit and refused
    usage = await store.usage("contested", now=START)
    assert usage.tokens.remaining == limit - charged
    assert min(refused) > limit - charged


async def test_concurrency_leases_admit_exactly_n(contest, store):
    """Nothing settles during the contest: exactly N leases are handed out."""
    n = 25
    await store.put("contested", QuotaLimits(max_concurrency=n))
    outcomes = contest([[(1, 1)] * PER_PROCESS] * PROCESSES, None)
    assert sum(allowed for allowed, _, _ in outcomes) == n
    assert {limit for allowed, limit, _ in outcomes if not allowed} == {"concurrency"}
    assert (await store.usage("contested")).in_flight == n
