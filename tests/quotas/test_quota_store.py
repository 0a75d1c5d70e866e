"""QuotaStore on every backend: limits in Redis and a tenant's usage."""

from __future__ import annotations

from quotas import Demand, QuotaLimits

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
