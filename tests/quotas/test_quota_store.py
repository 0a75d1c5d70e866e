"""QuotaStore on every backend: limits in Redis and a tenant's usage."""

from __future__ import annotations

import time

from quotas import BudgetUse, Demand, Limiter, QuotaLimits

START = 1_700_000_000.0


async def test_put_get_delete(store):
    limits = QuotaLimits(requests_per_minute=5, allowed_tiers={"default"})
    assert await store.get("acme") is None
    await store.put("acme", limits)
    await store.put("acme", QuotaLimits(tokens_per_minute=7), key="k1")
    assert await store.get("acme") == limits
    assert await store.get("acme", "k1") == QuotaLimits(tokens_per_minute=7)
    await store.put("acme", QuotaLimits(max_concurrency=1))  # replaces, keeps nothing old
    assert await store.get("acme") == QuotaLimits(max_concurrency=1)
    await store.delete("acme", "k1")
    assert await store.get("acme", "k1") is None


async def test_usage_reports_rates_leases_and_budgets(store, limiter):
    await store.put(
        "acme",
        QuotaLimits(
            requests_per_minute=10, tokens_per_minute=1000, max_concurrency=5, daily_token_budget=10_000
        ),
    )
    empty = await store.usage("acme", now=START)
    assert (empty.requests.remaining, empty.tokens.remaining, empty.in_flight) == (10, 1000, 0)
    assert (empty.daily_used, empty.daily_remaining, empty.monthly_remaining) == (0, 10_000, None)
    for _ in range(3):
        await limiter.admit(Demand("acme", 100, 100), now=START)
    usage = await store.usage("acme", now=START + 6)  # 6 s later: 1 request, 100 tokens back
    assert usage.requests.remaining == 8 and usage.requests.reset_after == 12.0
    assert usage.tokens.remaining == 500 and usage.tokens.reset_after == 30.0
    assert (usage.in_flight, usage.max_concurrency, usage.daily_used) == (3, 5, 600)
    assert usage.daily_remaining == 9400 and usage.configured


async def test_clear_removes_every_key_of_one_tenant(store, limiter):
    for tenant in ("acme", "acme2"):
        await store.put(tenant, QuotaLimits(requests_per_minute=5, max_concurrency=2))
        await limiter.admit(Demand(tenant, 1, 1))
    assert await store.clear("acme") >= 3  # limits, rate state, leases, reservation
    assert await store.get("acme") is None and await store.get("acme2") is not None


BUDGETS = QuotaLimits(daily_token_budget=1000, monthly_token_budget=5000)


async def test_seeded_budgets_count_what_the_database_counted(store, limiter):
    """A Redis with no state for the scope (restarted, flushed) takes the database's counts of the
    day and the month; admissions then count on from them."""
    assert await store.seed_budgets("acme", None, BudgetUse(START, 900, 4000), now=START) == (True, True)
    await store.put("acme", BUDGETS)
    usage = await store.usage("acme", now=START)
    assert (usage.daily_used, usage.monthly_used) == (900, 4000)
    assert (await limiter.admit(Demand("acme", 50, 50), now=START)).allowed
    refused = await limiter.admit(Demand("acme", 1, 0), now=START)
    assert not refused.allowed and refused.limit == "daily_budget"
    # a key's budgets are its own
    assert await store.seed_budgets("acme", "k", BudgetUse(START, 10, 20), now=START) == (True, True)
    await store.put("acme", BUDGETS, key="k")
    assert (await store.usage("acme", "k", now=START)).daily_used == 10


async def test_a_period_redis_counts_keeps_its_count(store, limiter):
    await store.put("acme", BUDGETS)
    assert (await limiter.admit(Demand("acme", 30, 0), now=START)).allowed  # Redis counts the day
    assert await store.seed_budgets("acme", None, BudgetUse(START, 900, 4000), now=START) == (False, False)
    usage = await store.usage("acme", now=START)
    assert (usage.daily_used, usage.monthly_used) == (30, 30)


async def test_counts_of_a_period_that_has_ended_are_not_written(store):
    """Counted just before midnight, written just after: the day's count is not the new day's
    (the month's still is, when the month goes on)."""
    day_s = 86400
    midnight = (START // day_s + 1) * day_s
    counted = BudgetUse(midnight - 1, 700, 800)
    assert await store.seed_budgets("acme", None, counted, now=midnight + 1) == (False, True)
    await store.put("acme", BUDGETS)
    usage = await store.usage("acme", now=midnight + 1)
    assert (usage.daily_used, usage.monthly_used) == (0, 800)


async def test_the_limiter_seeds_a_budgeted_scope_before_its_limits(client, keyspace):
    """First sight of a scope (as after a Redis restart): the budgets' use is read with the limits,
    for a scope with budgets only, and before any admission of it."""
    calls = []

    async def load(tenant, key):
        return BUDGETS if tenant == "budgeted" else QuotaLimits(requests_per_minute=10)

    async def budgets(tenant, key):
        calls.append((tenant, key))
        return BudgetUse(time.time(), 990, 990)  # now, on Redis's clock as the limiter's calls are

    limiter = Limiter(client, keys=keyspace, loader=load, budget_loader=budgets)
    refused = await limiter.admit(Demand("budgeted", 20, 0))
    assert not refused.allowed and refused.limit == "daily_budget"
    assert (await limiter.admit(Demand("budgeted", 10, 0))).allowed
    assert (await limiter.admit(Demand("unbudgeted", 20, 0))).allowed
    assert calls == [("budgeted", None)]
