"""Settlement: after completed, failed, cancelled and rejected requests, what the tenant was
charged equals the sum of the real usage records."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from quotas import Demand, Enqueue, QuotaLimits, settlement

START = 1_700_000_000.0
LIMITS = QuotaLimits(
    requests_per_minute=50,
    tokens_per_minute=100_000,
    max_concurrency=20,
    daily_token_budget=50_000,
    monthly_token_budget=400_000,
    max_tokens_per_request=512,
    allowed_tiers={"default", "batch"},
)


@dataclass
class Record:
    """A usage record as the gateway would write it: tokens really used by one request."""

    outcome: str
    tokens: int
    key: str | None = None


async def _mix(limiter, now):
    """Run a mix of requests the way the gateway would; return the usage records written."""
    records: list[Record] = []

    async def completed(prompt, max_tokens, completion):
        d = await limiter.admit(Demand("acme", prompt, max_tokens, key="k1"), now=now)
        assert d.allowed
        await asyncio.sleep(0)  # "runs"
        assert await limiter.settle(d.reservation, prompt + completion, now=now) == "settled"
        records.append(Record("completed", prompt + completion, key="k1"))

    async def failed(prompt, max_tokens):  # failed before running (e.g. lane refused it)
        d = await limiter.admit(Demand("acme", prompt, max_tokens, key="k1"), now=now)
        assert d.allowed
        assert await limiter.refund(d.reservation, now=now) == "settled"

    async def cancelled(prompt, max_tokens, streamed):  # client left mid-stream
        d = await limiter.admit(Demand("acme", prompt, max_tokens), now=now)
        assert d.allowed
        assert await limiter.settle(d.reservation, prompt + streamed, now=now) == "settled"
        # a second settlement (e.g. cancel handler and finally-block both fire) is a no-op
        assert await limiter.settle(d.reservation, prompt + max_tokens, now=now) == "unknown"
        assert await limiter.refund(d.reservation, now=now) == "unknown"
        records.append(Record("cancelled", prompt + streamed))

    async def rejected(prompt, max_tokens, limit, tier="default"):
        d = await limiter.admit(Demand("acme", prompt, max_tokens, tier=tier), now=now)
        assert not d.allowed and d.limit == limit

    await asyncio.gather(
        *(completed(100 + i, 256, 17 * i) for i in range(10)),
        *(failed(300, 400) for _ in range(5)),
        *(cancelled(50, 500, 3 * i) for i in range(5)),
        rejected(10, 4096, "max_tokens"),
        rejected(10, 10, "tier", tier="realtime"),
    )
    # One overrun: the tokenizer counted more prompt tokens than estimated at admission.
    d = await limiter.admit(Demand("acme", 20, 30), now=now)
    await limiter.settle(d.reservation, 70, now=now)
    records.append(Record("completed", 70))
    await rejected(49_000, 500, "daily_budget")
    return records


@pytest.mark.parametrize("clock", ["frozen", "redis-time"])
async def test_charged_tokens_equal_real_usage(store, limiter, clock):
    now = START if clock == "frozen" else None
    await store.put("acme", LIMITS)
    await store.put("acme", QuotaLimits(daily_token_budget=30_000), key="k1")
    records = await _mix(limiter, now)
    used = sum(r.tokens for r in records)
    key_used = sum(r.tokens for r in records if r.key == "k1")

    usage = await store.usage("acme", now=now)
    assert usage.daily_used == used and usage.monthly_used == used
    assert usage.daily_remaining == LIMITS.daily_token_budget - used
    assert usage.in_flight == 0  # every lease released
    key_usage = await store.usage("acme", "k1", now=now)
    assert key_usage.daily_used == key_used and key_usage.daily_remaining == 30_000 - key_used
    if clock == "frozen":  # no refill: the rate buckets show exactly what stayed charged
        assert usage.tokens.remaining == LIMITS.tokens_per_minute - used
        # failed requests were refunded entirely, their request count included
        admitted_and_kept = 10 + 5 + 1
        assert usage.requests.remaining == LIMITS.requests_per_minute - admitted_and_kept


async def test_expired_reservation_stays_charged_and_lease_frees(store, client, keyspace):
    """A gateway that crashed never settles: its lease frees after lease_ttl (injected clock)
    and its tokens stay charged."""
    from quotas import Limiter

    limiter = Limiter(client, keys=keyspace, lease_ttl=5.0, settle_grace=0.0)
    await store.put("acme", QuotaLimits(max_concurrency=1, daily_token_budget=1000))
    d = await limiter.admit(Demand("acme", 100, 100), now=START)
    assert d.allowed
    busy = await limiter.admit(Demand("acme", 1, 1), now=START + 4.9)
    assert (busy.allowed, busy.limit) == (False, "concurrency")
    assert busy.retry_after == pytest.approx(0.1)  # the crashed holder's lease expires then
    after = await limiter.admit(Demand("acme", 1, 1), now=START + 5.0)
    assert after.allowed  # the expired lease was dropped
    usage = await store.usage("acme", now=START + 5.0)
    assert usage.in_flight == 1 and usage.daily_used == 202


async def test_settling_after_the_record_expired_changes_nothing(store, client, keyspace):
    """Real clock: once lease_ttl + settle_grace has passed, settlement is a no-op and the
    reservation stays charged in full; the lease has expired with it."""
    from quotas import Limiter

    limiter = Limiter(client, keys=keyspace, lease_ttl=0.15, settle_grace=0.0)
    await store.put("acme", QuotaLimits(max_concurrency=1, daily_token_budget=1000))
    d = await limiter.admit(Demand("acme", 100, 100))
    await asyncio.sleep(0.3)
    assert await limiter.settle(d.reservation, 10) == "unknown"
    usage = await store.usage("acme")
    assert usage.in_flight == 0 and usage.daily_used == 200


async def test_renewed_lease_outlives_lease_ttl(store, client, keyspace):
    """A long stream renews its lease; the slot stays taken until settlement."""
    from quotas import Limiter

    limiter = Limiter(client, keys=keyspace, lease_ttl=5.0)
    await store.put("acme", QuotaLimits(max_concurrency=1))
    d = await limiter.admit(Demand("acme", 1, 1), now=START)
    assert await limiter.renew(d.reservation, now=START + 4)
    assert not (await limiter.admit(Demand("acme", 1, 1), now=START + 8.9)).allowed
    assert (await limiter.admit(Demand("acme", 1, 1), now=START + 9.0)).allowed  # expired
    assert not await limiter.renew(d.reservation, now=START + 9.5)  # not brought back
    assert await limiter.settle(d.reservation, 2, now=START + 9.5) == "settled"
    assert not await limiter.renew(d.reservation, now=START + 9.5)  # settled: nothing to renew


async def test_cancelled_admission_is_refunded(store, limiter):
    """Callers are cancelled (client gone) at every point of admit: before the script ran,
    after it ran but before the reply was read, after the reply. Once the background refunds
    are done, only the admissions whose caller got the Decision stay charged."""
    await store.put("acme", QuotaLimits(max_concurrency=10_000, daily_token_budget=10**6))
    kept = cancelled = 0
    for round_ in range(10):
        tasks = [asyncio.ensure_future(limiter.admit(Demand("acme", 10, 10))) for _ in range(30)]
        await asyncio.sleep(0.0003 * round_)
        for task in tasks:
            task.cancel()
        for task in tasks:
            try:
                kept += (await task).allowed
            except asyncio.CancelledError:
                cancelled += 1
    await limiter.aclose()
    usage = await store.usage("acme")
    assert cancelled > 0
    assert (usage.in_flight, usage.daily_used) == (kept, 20 * kept)


async def test_a_refund_that_overtakes_its_admission_leaves_nothing_charged(store, limiter):
    """The refund of a cancelled admission may reach Redis first: its tombstone voids the
    admission when it arrives."""
    from quotas import Reservation

    await store.put("acme", QuotaLimits(max_concurrency=1, daily_token_budget=100))
    ghost = Reservation(
        id="r-ghost", tenant="acme", key=None, tier="default", reserved_tokens=20, lease_id="r-ghost"
    )
    assert await limiter.refund(ghost) == "unknown"
    keys, args = limiter._admission(Demand("acme", 10, 10), "r-ghost", None)
    reply = await limiter.scripts.admit(keys=keys, args=args)  # the late admission
    assert int(reply[0]) == 0
    usage = await store.usage("acme")
    assert (usage.in_flight, usage.daily_used) == (0, 0)


async def test_a_settlement_from_the_queued_entry_charges_as_the_limiter_does(
    store, limiter, client, keyspace
):
    """An admission that queues an entry with ``settlement`` puts settle.lua's arguments in it;
    the process ending the request settles with them (here in a MULTI, as a worker publishes),
    exactly as Limiter.settle would, and once: a second settlement of either kind changes nothing."""
    await store.put("acme", LIMITS)
    await store.put("acme", QuotaLimits(daily_token_budget=30_000), key="k1")
    stream = f"{keyspace.scope('acme')}:lane"
    demand = Demand("acme", 100, 200, key="k1", tier="batch")
    by_limiter = await limiter.admit(demand, enqueue=Enqueue(stream, {"body": "a"}), now=START)
    from_entry = await limiter.admit(
        demand, enqueue=Enqueue(stream, {"body": "b"}, settlement=True), now=START
    )
    entries = dict((fields[b"body"], fields) for _, fields in await client.xrange(stream))
    assert settlement.FIELD.encode() not in entries[b"a"]  # only where asked for
    keys, args = settlement.settle_call(entries[b"b"][settlement.FIELD.encode()], 100 + 17)
    args[0] = int(START * 1_000_000)  # the frozen clock of this test ('' = Redis's TIME)
    assert await client.script_load(settlement.SOURCE) == settlement.SHA  # the name EVALSHA uses
    async with client.pipeline(transaction=True) as pipe:
        pipe.xadd(stream, {"body": "a result"})
        pipe.evalsha(settlement.SHA, len(keys), *keys, *args)
        replies = await pipe.execute()
    assert int(replies[1][0]) == 1  # settled now
    assert await limiter.settle(by_limiter.reservation, 100 + 17, now=START) == "settled"
    assert await limiter.settle(from_entry.reservation, 100 + 17, now=START) == "unknown"
    usage = await store.usage("acme", now=START)
    assert usage.in_flight == 0 and usage.daily_used == 2 * 117
    assert usage.tokens.remaining == LIMITS.tokens_per_minute - 2 * 117
    key_usage = await store.usage("acme", "k1", now=START)
    assert key_usage.daily_used == 2 * 117


def test_a_settlement_refuses_negative_usage():
    with pytest.raises(ValueError, match="used_tokens"):
        settlement.settle_call('["k","r",1,"t","","x"]', -1)
