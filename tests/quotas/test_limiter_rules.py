"""Every limit of the Limiter, on every backend: what refuses, what is charged, and that a
refusal charges nothing (all or none)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from quotas import Demand, Enqueue, Limiter, QuotaLimits, QuotaNotConfigured

START = 1_700_000_000.0


def utc(*args) -> float:
    return datetime(*args, tzinfo=UTC).timestamp()


async def _state(store, tenant="acme", key=None, now=START):
    u = await store.usage(tenant, key, now=now)
    return (
        u.requests and u.requests.remaining,
        u.tokens and u.tokens.remaining,
        u.in_flight,
        u.daily_used,
        u.monthly_used,
    )


async def test_a_refusal_charges_nothing(store, limiter):
    """Four limits; the third (daily budget) refuses: rpm, tpm, lease and month untouched."""
    await store.put(
        "acme",
        QuotaLimits(
            requests_per_minute=10,
            tokens_per_minute=5000,
            max_concurrency=3,
            daily_token_budget=1000,
            monthly_token_budget=10_000,
        ),
    )
    d = await limiter.admit(Demand("acme", 800, 100), now=START)
    assert d.allowed
    before = await _state(store)
    assert before == (9, 4100, 1, 900, 900)
    refused = await limiter.admit(Demand("acme", 100, 100), now=START)
    assert (refused.allowed, refused.limit, refused.scope) == (False, "daily_budget", "tenant")
    assert await _state(store) == before


async def test_key_limits_apply_too_and_the_stricter_wins(store, limiter):
    await store.put("acme", QuotaLimits(requests_per_minute=100, daily_token_budget=10_000))
    await store.put("acme", QuotaLimits(requests_per_minute=2), key="k1")
    await store.put("acme", QuotaLimits(), key="k2")  # configured, unlimited
    got = [await limiter.admit(Demand("acme", 5, 5, key="k1"), now=START) for _ in range(3)]
    assert [d.allowed for d in got] == [True, True, False]
    assert (got[2].limit, got[2].scope) == ("requests_per_minute", "key")
    assert got[1].requests.limit == 2  # headers show the strictest bucket
    assert (await limiter.admit(Demand("acme", 5, 5, key="k2"), now=START)).allowed
    assert (await limiter.admit(Demand("acme", 5, 5), now=START)).allowed
    # the key's refusal charged the tenant nothing: 4 admitted in all
    assert (await store.usage("acme", now=START)).requests.remaining == 96
    assert (await store.usage("acme", now=START)).daily_used == 40


async def test_tier_share_caps_the_tier_inside_the_tenant_bucket(store, limiter):
    await store.put("acme", QuotaLimits(requests_per_minute=10, tier_shares={"batch": 0.5}))
    batch = [await limiter.admit(Demand("acme", 1, 1, tier="batch"), now=START) for _ in range(6)]
    assert [d.allowed for d in batch] == [True] * 5 + [False]
    assert batch[5].limit == "requests_per_minute" and batch[0].requests.limit == 5
    rest = [await limiter.admit(Demand("acme", 1, 1), now=START) for _ in range(6)]
    assert [d.allowed for d in rest] == [True] * 5 + [False]  # batch used half the tenant's


async def test_permanent_refusals_have_no_retry_after(store, limiter):
    await store.put(
        "acme", QuotaLimits(tokens_per_minute=1000, max_tokens_per_request=256, allowed_tiers={"default"})
    )
    cases = [
        (Demand("acme", 10, 300), "max_tokens"),
        (Demand("acme", 10, 10, tier="batch"), "tier"),
        (Demand("acme", 900, 200), "tokens_per_minute"),
    ]  # 1100 can never fit in 1000
    for demand, limit in cases:
        d = await limiter.admit(demand, now=START)
        assert (d.allowed, d.limit, d.retry_after, d.retryable) == (False, limit, None, False)


async def test_the_refusal_that_frees_last_is_reported(store, limiter):
    await store.put("acme", QuotaLimits(requests_per_minute=1, daily_token_budget=30))
    now = utc(2024, 5, 1, 23, 0, 0)
    assert (await limiter.admit(Demand("acme", 10, 10), now=now)).allowed
    d = await limiter.admit(Demand("acme", 10, 10), now=now)  # rpm frees in 60 s, day in 1 h
    assert (d.limit, d.retry_after) == ("daily_budget", 3600.0)


async def test_concurrency_leases_are_released_by_settlement(store, limiter):
    await store.put("acme", QuotaLimits(max_concurrency=2))
    a, b = [await limiter.admit(Demand("acme", 1, 1), now=START) for _ in range(2)]
    c = await limiter.admit(Demand("acme", 1, 1), now=START)
    assert (c.allowed, c.limit, c.retry_after) == (False, "concurrency", 1.0)
    assert await limiter.settle(a.reservation, 2, now=START) == "settled"
    assert (await limiter.admit(Demand("acme", 1, 1), now=START)).allowed


@pytest.mark.parametrize(
    "now, retry, later",
    [
        (utc(2024, 2, 29, 23, 59, 59), 1.0, utc(2024, 3, 1)),  # leap day
        (utc(2023, 12, 31, 23, 0, 0), 3600.0, utc(2024, 1, 1)),  # new year
    ],
)
async def test_daily_budget_renews_at_utc_midnight(store, limiter, now, retry, later):
    await store.put("acme", QuotaLimits(daily_token_budget=100))
    assert (await limiter.admit(Demand("acme", 50, 50), now=now)).allowed
    d = await limiter.admit(Demand("acme", 1, 0), now=now)
    assert (d.limit, d.retry_after) == ("daily_budget", retry)
    assert (await limiter.admit(Demand("acme", 50, 50), now=later)).allowed


@pytest.mark.parametrize(
    "now, month_end",
    [
        (utc(2024, 2, 10, 12), utc(2024, 3, 1)),
        (utc(2023, 2, 28, 12), utc(2023, 3, 1)),
        (utc(2023, 12, 31, 12), utc(2024, 1, 1)),
        (utc(2100, 2, 28), utc(2100, 3, 1)),  # not a leap year
    ],
)
async def test_monthly_budget_renews_on_the_first_of_the_month(store, limiter, now, month_end):
    await store.put("acme", QuotaLimits(monthly_token_budget=100))
    assert (await limiter.admit(Demand("acme", 100, 0), now=now)).allowed
    d = await limiter.admit(Demand("acme", 1, 0), now=now)
    assert (d.limit, d.retry_after) == ("monthly_budget", month_end - now)
    assert (await limiter.admit(Demand("acme", 100, 0), now=month_end)).allowed
    usage = await store.usage("acme", now=month_end)
    assert usage.monthly_used == 100 and usage.monthly_reset_after > 27 * 86400


async def test_a_new_limit_is_in_force_on_the_next_admission(store, limiter):
    await store.put("acme", QuotaLimits(requests_per_minute=1))
    assert (await limiter.admit(Demand("acme", 1, 1), now=START)).allowed
    assert not (await limiter.admit(Demand("acme", 1, 1), now=START)).allowed
    await store.put("acme", QuotaLimits(requests_per_minute=3))  # raised: 1 of 3 used
    got = [await limiter.admit(Demand("acme", 1, 1), now=START) for _ in range(3)]
    assert [d.allowed for d in got] == [True, True, False]
    await store.put("acme", QuotaLimits(requests_per_minute=3, allowed_tiers={"batch"}))
    assert (await limiter.admit(Demand("acme", 1, 1), now=START + 60)).limit == "tier"


async def test_refund_gives_the_request_back(store, limiter):
    await store.put("acme", QuotaLimits(requests_per_minute=1, tokens_per_minute=100))
    d = await limiter.admit(Demand("acme", 50, 50), now=START)
    assert not (await limiter.admit(Demand("acme", 1, 1), now=START)).allowed
    assert await limiter.refund(d.reservation, now=START) == "settled"
    again = await limiter.admit(Demand("acme", 50, 50), now=START)
    assert again.allowed and again.requests.remaining == 0 and again.tokens.remaining == 0


async def test_missing_limits_need_a_loader(store, client, keyspace):
    with pytest.raises(QuotaNotConfigured, match="'ghost'"):
        await Limiter(client, keys=keyspace).admit(Demand("ghost", 1, 1))
    calls = []

    async def load(tenant, key):
        calls.append((tenant, key))
        return QuotaLimits(requests_per_minute=1) if key is None else None

    limiter = Limiter(client, keys=keyspace, loader=load)
    assert (await limiter.admit(Demand("ghost", 1, 1, key="k"), now=START)).allowed
    assert not (await limiter.admit(Demand("ghost", 1, 1, key="k"), now=START)).allowed
    assert calls == [("ghost", None), ("ghost", "k")]  # once each, then read from Redis
    assert await store.get("ghost", "k") == QuotaLimits()


async def test_an_admission_queues_its_stream_entry_and_a_refusal_queues_nothing(client, keyspace):
    """enqueue: the entry is added in the admission's own call, once, only if admitted (here
    after loading the missing limits first: the retried call queues it once)."""

    async def load(tenant, key):
        return QuotaLimits(requests_per_minute=1)

    limiter = Limiter(client, keys=keyspace, loader=load)
    stream = f"{keyspace.prefix}:lane"  # under the prefix: cleaned up after the test
    first = await limiter.admit(Demand("acme", 1, 1, key="k1"), enqueue=Enqueue(stream, {"body": "one"}))
    second = await limiter.admit(Demand("acme", 1, 1, key="k1"), enqueue=Enqueue(stream, {"body": "two"}))
    assert first.allowed and first.entry_id is not None
    assert (second.allowed, second.entry_id) == (False, None)
    entries = await client.xrange(stream)
    assert [(entry_id.decode(), fields) for entry_id, fields in entries] == [
        (first.entry_id, {b"body": b"one"})
    ]


async def test_a_refusal_reports_the_rates_as_they_are(store, limiter):
    """The x-ratelimit-* of a refusal show what is left now, not what the refused request would
    have left: a request refused by tokens/min did not take one of the requests/min (it was
    reported one short, with a reset 6 s too late)."""
    await store.put("acme", QuotaLimits(requests_per_minute=10, tokens_per_minute=100))
    assert (await limiter.admit(Demand("acme", 40, 0), now=START)).allowed
    assert (await limiter.admit(Demand("acme", 40, 0), now=START)).allowed
    refused = await limiter.admit(Demand("acme", 40, 0), now=START)
    assert (refused.allowed, refused.limit) == (False, "tokens_per_minute")
    usage = await store.usage("acme", now=START)
    assert refused.requests == usage.requests and refused.requests.remaining == 8
    assert refused.tokens == usage.tokens and refused.tokens.remaining == 20
