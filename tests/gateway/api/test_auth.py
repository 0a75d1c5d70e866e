"""Key cache: lookups, and revocation seen by another replica within 1 s (real Redis, real DB)."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
import redis.asyncio as aioredis

from gateway.api.auth import GENERATION_KEY, KeyCache
from tenancy import (
    create_api_key,
    create_tenant,
    disable_tenant,
    make_engine,
    make_session_factory,
    revoke_api_key,
)


@pytest.fixture
def session_factory(database_url):
    engine = make_engine(database_url)
    yield make_session_factory(engine)
    engine.dispose()


@pytest.fixture
async def aredis(redis_url):
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def test_concurrent_misses_of_one_key_read_the_database_once(session_factory, aredis):
    with session_factory() as session:
        tenant = create_tenant(session, name=f"t{uuid.uuid4().hex[:6]}")
        created = create_api_key(session, tenant_id=tenant.id)
    cache = KeyCache(session_factory, aredis)
    loads = []
    load = cache._load
    cache._load = lambda key: loads.append(key) or load(key)  # counts the database reads
    contexts = await asyncio.gather(*(cache.lookup(created.key) for _ in range(20)))
    assert {c.tenant_id for c in contexts} == {tenant.id}
    assert loads == [created.key]
    await cache.lookup(created.key)  # cached now
    assert len(loads) == 1


async def _wait_until_refused(cache: KeyCache, key: str, limit_s: float) -> float:
    start = time.monotonic()
    while await cache.lookup(key) is not None:
        assert time.monotonic() - start < limit_s, "revocation not seen in time"
        await asyncio.sleep(0.02)
    return time.monotonic() - start


async def test_lookup_returns_the_tenant_context(session_factory, aredis):
    with session_factory() as session:
        tenant = create_tenant(session, name=f"t{uuid.uuid4().hex[:6]}", weight=3.0)
        created = create_api_key(session, tenant_id=tenant.id, scopes=["inference"])
    cache = KeyCache(session_factory, aredis)
    context = await cache.lookup(created.key)
    assert (context.tenant_id, context.weight, context.key_id) == (tenant.id, 3.0, created.api_key.id)
    assert context.allowed_tiers == ("standard", "batch") and context.scopes == ("inference",)
    assert await cache.lookup(created.key + "x") is None
    assert await cache.lookup("not-a-key") is None
    with session_factory() as session:  # last_used_at was written on first use
        from tenancy import get_api_key

        assert get_api_key(session, key_id=created.api_key.id).last_used_at is not None


@pytest.mark.parametrize("change", ["revoke_key", "disable_tenant"])
async def test_other_replica_sees_the_change_within_one_second(session_factory, aredis, change):
    with session_factory() as session:
        tenant = create_tenant(session, name=f"t{uuid.uuid4().hex[:6]}")
        created = create_api_key(session, tenant_id=tenant.id)
    replica_a, replica_b = KeyCache(session_factory, aredis), KeyCache(session_factory, aredis)
    assert await replica_a.lookup(created.key) is not None
    assert await replica_b.lookup(created.key) is not None  # both have it cached now
    with session_factory() as session:
        if change == "revoke_key":
            revoke_api_key(session, key_id=created.api_key.id)
        else:
            disable_tenant(session, tenant_id=tenant.id)
    await replica_a.invalidate()
    assert await replica_a.lookup(created.key) is None  # the replica that made the change: at once
    assert replica_a.tenant_disabled(created.key) is (change == "disable_tenant")  # what the 401 says
    assert await _wait_until_refused(replica_b, created.key, limit_s=1.0) < 1.0


async def test_cache_serves_repeat_lookups_without_the_database(session_factory, aredis, database_url):
    with session_factory() as session:
        tenant = create_tenant(session, name=f"t{uuid.uuid4().hex[:6]}")
        created = create_api_key(session, tenant_id=tenant.id)
    cache = KeyCache(session_factory, aredis, refresh_s=60)
    await cache.lookup(created.key)
    with session_factory() as session:  # change the DB behind the cache's back, no invalidation
        revoke_api_key(session, key_id=created.api_key.id)
    assert await cache.lookup(created.key) is not None  # still cached: proves the cache is used
    await aredis.incr(GENERATION_KEY)
    cache._checked_at = float("-inf")  # as if refresh_s had passed
    assert await cache.lookup(created.key) is None


async def test_a_change_made_without_the_redis_bump_is_seen_within_the_max_age(session_factory, aredis):
    """`fairlane admin --database-url` without --redis-url revokes in the database only: no replica
    hears of it, and a cached key used to work until the gateway restarted."""
    with session_factory() as session:
        tenant = create_tenant(session, name=f"t{uuid.uuid4().hex[:6]}")
        created = create_api_key(session, tenant_id=tenant.id)
    cache = KeyCache(session_factory, aredis, max_age_s=0.3)
    assert await cache.lookup(created.key) is not None
    with session_factory() as session:
        revoke_api_key(session, key_id=created.api_key.id)
    assert await cache.lookup(created.key) is not None  # still cached
    assert 0.1 < await _wait_until_refused(cache, created.key, limit_s=2.0) < 1.0
