"""A Redis client configured for admission: short timeouts, few retries, a bounded pool.

A quota check sits on every request's path, so an unreachable Redis must be noticed in a
fraction of a second (then the limiter fails closed or open) rather than after redis-py's
default ten retries. The client reconnects by itself when Redis comes back. The pool blocks
callers beyond ``max_connections`` instead of failing them: a burst of admissions queues
for a connection (up to ``pool_timeout``) rather than looking like a Redis outage.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError, TimeoutError


def connect(
    url: str,
    *,
    timeout: float = 0.5,
    retries: int = 1,
    max_connections: int = 64,
    pool_timeout: float = 2.0,
    **kwargs: Any,
) -> Redis:
    """An asyncio Redis client for ``url`` (``redis://``, ``rediss://`` or ``unix://``).

    ``timeout`` (seconds) bounds connecting and each reply; ``retries`` extra attempts
    (backoff 10 ms, 20 ms, … capped at 100 ms) cover one dropped connection, e.g. the first
    call after a Redis restart. ``pool_timeout`` (seconds) is the longest wait for a free
    connection. Other keyword arguments go to the connection pool.
    """
    retry = Retry(
        ExponentialBackoff(cap=0.1, base=0.01),
        retries,
        # OSError too (a refused connection), which redis-py's annotation leaves out
        supported_errors=(ConnectionError, TimeoutError, OSError),  # type: ignore[arg-type]
    )
    pool = BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=pool_timeout,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=retry,
        **kwargs,
    )
    return Redis.from_pool(pool)  # the client owns the pool: aclose() closes both
