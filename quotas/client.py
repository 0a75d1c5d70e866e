"""A Redis client configured for admission: short timeouts and few retries.

A quota check sits on every request's path, so an unreachable Redis must be noticed in a
fraction of a second (then the limiter fails closed or open) rather than after redis-py's
default ten retries. The client reconnects by itself when Redis comes back.
"""

from __future__ import annotations

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError, TimeoutError


def connect(url: str, *, timeout: float = 0.5, retries: int = 1, **kwargs) -> Redis:
    """An asyncio Redis client for ``url`` (``redis://``, ``rediss://`` or ``unix://``).

    ``timeout`` (seconds) bounds connecting and each reply; ``retries`` extra attempts
    (backoff 10 ms, 20 ms, … capped at 100 ms) cover one dropped connection, e.g. the first
    call after a Redis restart. Other keyword arguments go to ``Redis.from_url``.
    """
    retry = Retry(ExponentialBackoff(cap=0.1, base=0.01), retries,
                  supported_errors=(ConnectionError, TimeoutError, OSError))
    return Redis.from_url(
        url, socket_timeout=timeout, socket_connect_timeout=timeout, retry=retry, **kwargs,
    )
