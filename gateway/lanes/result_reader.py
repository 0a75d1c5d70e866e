"""One reader of result streams per replica: a single blocking XREAD over the ``out:{id}`` streams of
every request in flight, instead of one per request.

A blocking read per request holds a Redis connection for as long as the request waits: at a rate
the replica cannot keep up with, the requests in flight take every connection of the pool and
admissions fail for want of one. Here one task reads every registered stream at once and hands
each request its entries. A request that registers while the read blocks wakes it with an XADD to
the reader's own wake stream (one per blocking read, however many requests register meanwhile), so
a new request waits for no poll.

A stream whose last result has been read (``is_last``) leaves the read at once, before its
request releases it: the next blocking read is not spent on a finished stream, and when no
unfinished stream is left the reader stops, so that the next request starts a read of its own
instead of waking one that only waits on finished streams (a round trip and a read fewer).

``read`` answers as ``XREAD`` does for one stream (``[[key, entries]]``, or ``[]`` when nothing
came within its timeout); a Redis error ends the current read of every request with that error.

The blocking reads go over a connection of the reader's own (quotas/resp.py: a few dozen µs of
Python a read instead of redis-py's pool and parser callbacks, which a request at concurrency 1 pays
after every idle pause), retried as the lanes client retries a command (connect.py: an XREAD only
reads, so a read cut by a dropped connection is simply sent again, as many times as the client
retries); a TLS client reads through redis-py.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis

from gateway.lanes.connect import BACKOFF_BASE_S, BACKOFF_CAP_S, ERRORS
from gateway.telemetry import path_marks
from quotas.resp import RespConnection

WAKE_TTL_MS = 60_000  # the wake stream outlives a reader that died by this much at most


class _Waiting:
    """One request's stream: where the reader is in it, and what it read that the request has not."""

    def __init__(self, last_id: str) -> None:
        self.last_id = last_id
        self.entries: list = []
        self.error: BaseException | None = None
        self.ready = asyncio.Event()
        self.finished = False  # its last result was read: no read asks for it again


class ResultReader:
    """The replica's reader of result streams (asyncio; bound to the loop that first uses it)."""

    def __init__(
        self,
        redis: aioredis.Redis,
        *,
        batch: int,
        block_ms: int,
        is_last: Callable[[Any], bool] = lambda fields: False,
    ) -> None:
        """``is_last(fields)``: whether an entry is its stream's last one (never raises)."""
        self.redis, self.batch, self.block_ms, self.is_last = redis, batch, block_ms, is_last
        self.wake_key = f"relay:wake:{uuid.uuid4().hex}"
        self._wake_id = "0-0"  # not "$": a wake added before the first read reached Redis counts
        self._streams: dict[str, _Waiting] = {}
        self._task: asyncio.Task | None = None
        self._reading: set[str] = set()  # the streams of the read in flight
        self._woken = False
        self._lean = RespConnection.for_client(redis)
        self._retries = 0
        if self._lean is not None:  # a read is retried whole (_xread), connecting included
            self._retries, self._lean.retries = self._lean.retries, 0

    async def read(self, key: str, last_id: str, timeout_ms: int) -> list:
        """``key``'s entries after ``last_id`` (``[[key, entries]]``), or ``[]`` after ``timeout_ms``."""
        waiting = self._streams.get(key)
        if waiting is None:
            waiting = self._streams[key] = _Waiting(last_id)
        elif waiting.finished and not waiting.entries:  # asked past its last result: read it again
            waiting.finished = False
        self._ensure_running()
        if key not in self._reading and self._reading and not self._woken:
            self._woken = True  # the read in flight lacks this stream: end it now
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.xadd(self.wake_key, {"w": "1"}, maxlen=1, approximate=False)
                pipe.pexpire(self.wake_key, WAKE_TTL_MS)
                await pipe.execute()
        if not waiting.entries and waiting.error is None:
            # asyncio.timeout, not wait_for: on Python 3.11 a request cancelled in the step its
            # entries came would get them and lose the cancel (its client gone, the server's drain)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_ms / 1000):
                    await waiting.ready.wait()
        waiting.ready.clear()
        if waiting.error is not None:
            error, waiting.error = waiting.error, None
            raise error
        entries, waiting.entries = waiting.entries, []
        return [[key, entries]] if entries else []

    @property
    def relaying(self) -> bool:
        """Whether a registered stream's last result is still to come (its request runs)."""
        return any(not waiting.finished for waiting in self._streams.values())

    def release(self, key: str) -> None:
        """The request is done with ``key`` (relayed to its end, failed or cancelled)."""
        self._streams.pop(key, None)

    def _ensure_running(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="result-reader")

    async def _run(self) -> None:
        while True:
            streams: dict[Any, Any] = {key: w.last_id for key, w in self._streams.items() if not w.finished}
            if not streams:
                break
            self._reading, self._woken = set(streams), False
            streams[self.wake_key] = self._wake_id
            try:
                reply: Any = await self._xread(streams)
                path_marks.mark("results_read")
            except Exception as exc:  # every waiting request fails its read with it, as its own XREAD would
                self._reading = set()
                for waiting in self._streams.values():
                    waiting.error = exc
                    waiting.ready.set()
                return
            for raw_key, entries in reply or ():
                key = raw_key.decode() if isinstance(raw_key, bytes) else raw_key
                if key == self.wake_key:
                    self._wake_id = entries[-1][0]
                    continue
                target = self._streams.get(key)
                if target is not None and entries:
                    target.entries.extend(entries)
                    target.last_id = entries[-1][0]
                    target.finished = any(self.is_last(fields) for _id, fields in entries)
                    target.ready.set()
        self._reading = set()

    async def _xread(self, streams: dict[Any, Any]) -> Any:
        """One blocking XREAD of ``streams`` as redis-py's ``xread`` answers it
        (``[[key, [(id, {field: value})]]]``; ``[]``: nothing within the block)."""
        if self._lean is None:
            return await self.redis.xread(streams, block=self.block_ms, count=self.batch)
        args = ("XREAD", "COUNT", self.batch, "BLOCK", self.block_ms, "STREAMS", *streams, *streams.values())
        for attempt in range(self._retries + 1):
            try:
                reply = await self._lean.execute(*args)
                break
            except ERRORS:
                if attempt == self._retries:
                    raise
                await asyncio.sleep(min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2**attempt))
        return [
            [key, [(i, dict(zip(kv[::2], kv[1::2], strict=True))) for i, kv in entries]]
            for key, entries in reply or ()
        ]

    async def aclose(self) -> None:
        """Stop reading and drop the wake stream (at shutdown)."""
        self._streams.clear()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        with contextlib.suppress(Exception):
            await self.redis.delete(self.wake_key)
        if self._lean is not None:
            await self._lean.aclose()
