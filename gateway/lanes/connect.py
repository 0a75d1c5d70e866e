"""Redis clients of the lanes protocol, for gateways (asyncio) and workers (blocking), configured
to live through outages: short connect timeouts, a few retries with exponential backoff on
connection errors and timeouts, and a health check on connections that were idle, so that a
client reconnects by itself when Redis comes back (a restarted server included).

What a caller does once the retries are spent differs by side: a worker keeps trying (it holds
tokens it must publish), a gateway ends the affected request with an error.
"""

from __future__ import annotations

import asyncio
import builtins
from typing import Any

import redis as redislib
import redis.asyncio as aioredis
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError, TimeoutError

RETRIES = 3  # extra attempts of one command: ~50 ms, 100 ms, 200 ms (about 0.35 s in all)
BACKOFF_BASE_S, BACKOFF_CAP_S = 0.05, 0.5
CONNECT_TIMEOUT_S = 2.0
# A reply may take this long; above every blocking read of the protocol (relay XREAD: 1 s).
SOCKET_TIMEOUT_S = 10.0
HEALTH_CHECK_S = 15  # a connection idle this long is PINGed before reuse (a dead one is replaced)
ERRORS = (ConnectionError, TimeoutError, OSError)


def _options(url: str) -> dict:
    options = dict(
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        socket_timeout=SOCKET_TIMEOUT_S,
        health_check_interval=HEALTH_CHECK_S,
    )
    if not url.startswith("unix:"):  # a TCP option: redis-py's unix-socket connections refuse it
        options["socket_keepalive"] = True
    return options


class _SendsCancellably:
    """redis-py's asyncio connection, its writes bounded by ``asyncio.timeout`` instead of
    ``asyncio.wait_for``: on Python 3.11, a task cancelled in the loop step its write completes in
    gets wait_for's result and loses the cancel (a gateway request cut by the server's drain, or by
    its client leaving, would run on as if nothing had happened). The write timeout is the socket
    timeout, as redis-py's."""

    socket_timeout: float | None

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        timeout, self.socket_timeout = self.socket_timeout, None  # redis-py writes without wait_for
        try:
            async with asyncio.timeout(timeout):
                await super().send_packed_command(command, check_health)  # type: ignore[misc]
        except builtins.TimeoutError as exc:  # redis-py has dropped the connection: a retry opens another
            raise TimeoutError("Timeout writing to socket") from exc
        finally:
            self.socket_timeout = timeout


_CANCELLABLE: dict[type[aioredis.connection.AbstractConnection], type] = {
    base: type(f"Cancellable{base.__name__}", (_SendsCancellably, base), {})
    for base in (aioredis.Connection, aioredis.SSLConnection, aioredis.UnixDomainSocketConnection)
}


def sync_client(url: str) -> redislib.Redis:
    """A worker's client: blocking, retrying with backoff, reconnecting."""
    from redis.retry import Retry

    retry = Retry(
        ExponentialBackoff(cap=BACKOFF_CAP_S, base=BACKOFF_BASE_S), RETRIES, supported_errors=ERRORS
    )
    return redislib.Redis.from_url(url, retry=retry, **_options(url))


def async_client(url: str, *, max_connections: int = 4096) -> aioredis.Redis:
    """A gateway's client: asyncio, retrying with backoff, reconnecting. ``max_connections`` bounds
    the pool (redis-py's asyncio default, 100, would fail the 101st request waiting on its results)."""
    from redis.asyncio.retry import Retry

    retry = Retry(
        ExponentialBackoff(cap=BACKOFF_CAP_S, base=BACKOFF_BASE_S),
        RETRIES,
        supported_errors=ERRORS,  # type: ignore[arg-type]  # OSError too, which redis-py's annotation leaves out
    )
    client = aioredis.Redis.from_url(url, retry=retry, max_connections=max_connections, **_options(url))
    pool = client.connection_pool  # the URL's connection class (TCP, TLS, unix socket), made cancellable
    pool.connection_class = _CANCELLABLE.get(pool.connection_class, pool.connection_class)
    return client
