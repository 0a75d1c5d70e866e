"""The key layout on every backend: the scripts build the names KeySpace gives, and a scope's
state hash lives as long as its longest need (quotas/keys.py, lua/state.lua)."""

from __future__ import annotations

import time

from quotas import Demand, QuotaLimits

SHARED = QuotaLimits(
    requests_per_minute=10,
    tokens_per_minute=1000,
    max_concurrency=4,
    daily_token_budget=10_000,
    tier_shares={"batch": 0.5},
)


async def _names(client, keyspace) -> set[str]:
    return {k.decode() for k in await client.keys(keyspace.pattern())}


async def test_the_scripts_use_the_names_of_keyspace(store, limiter, client, keyspace):
    await store.put("acme", SHARED)
    await store.put("acme", SHARED, key="k1")
    d = await limiter.admit(Demand("acme", 10, 10, key="k1", tier="batch"))
    assert d.allowed
    ks = keyspace
    scopes = {
        name
        for key in (None, "k1")
        for name in (
            ks.limits("acme", key),
            ks.state("acme", key),
            ks.leases("acme", key),
            ks.leases("acme", key, "batch"),
        )
    }
    assert await _names(client, ks) == scopes | {ks.reservation("acme", d.reservation.id)}
    assert await limiter.settle(d.reservation, 15) == "settled"
    # the record is gone, and so are the lease sets (their one lease was released)
    assert await _names(client, ks) == {n for n in scopes if not n.endswith(":leases")}
    usage = await store.usage("acme", "k1")
    assert (usage.requests.remaining, usage.tokens.remaining, usage.daily_used) == (9, 985, 15)


async def test_a_short_write_never_shortens_the_state_hash(store, limiter, client, keyspace):
    """A batch request's sub-bucket (1 request/min) needs 60 s; a later request that needs 12 s
    leaves the hash's expiry alone, so the batch sub-bucket is still remembered."""
    await store.put("acme", QuotaLimits(requests_per_minute=10, tier_shares={"batch": 0.1}))
    assert (await limiter.admit(Demand("acme", 1, 1, tier="batch"))).allowed
    assert (await limiter.admit(Demand("acme", 1, 1))).allowed
    assert 50_000 < await client.pttl(keyspace.state("acme")) <= 61_000
    refused = await limiter.admit(Demand("acme", 1, 1, tier="batch"))
    assert (refused.allowed, refused.limit, refused.requests.limit) == (False, "requests_per_minute", 1)


async def test_a_budget_keeps_the_state_hash_to_the_end_of_the_day(store, limiter, client, keyspace):
    await store.put("acme", QuotaLimits(requests_per_minute=10, daily_token_budget=1000))
    day_end = (int(time.time()) // 86400 + 1) * 86400  # UTC; the test may straddle midnight
    assert (await limiter.admit(Demand("acme", 1, 1))).allowed
    ttl_ms = await client.pttl(keyspace.state("acme"))
    assert any(abs(ttl_ms - (end - time.time()) * 1000) < 5_000 for end in (day_end, day_end + 86400))
