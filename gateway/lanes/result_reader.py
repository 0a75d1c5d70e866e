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

Echoes (gateway/lanes/hints.py): where the replica hinted a request to an idle worker on its host,
the worker also sends the request's last result to the replica's inbox, just before the transaction
that publishes it to Redis: the gateway has it while the worker builds and sends that transaction
and Redis runs it and answers the reader. Each echo names its position in the stream; the reader
hands it to the request when it is the next result and a last one (nothing comes after it to
disagree with it), and drops the Redis copy (an echo that is lost or comes late changes nothing:
the Redis copy follows). The Redis copy stays the record: a
stream whose last result came as an echo is read on until Redis shows it, after the request has
released it, and ``settled`` (awaited before each admission) waits for that: the worker settles
the request's quota in the same transaction, so the client's next request is admitted against the
settled quota, not the reservation.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis

from gateway.lanes import hints
from gateway.lanes.connect import BACKOFF_BASE_S, BACKOFF_CAP_S, ERRORS
from gateway.lanes.keys import out_key
from gateway.telemetry import metrics, path_marks
from quotas.resp import RespConnection

WAKE_TTL_MS = 60_000  # the wake stream outlives a reader that died by this much at most
ECHO_ENTRY_ID = "0-0"  # an echoed result's id for the request (its Redis id is not known yet)
# A released stream whose echoed last result Redis has not shown is read this long at most, and an
# admission waits this long at most for those (a worker that died between its echo and its publish).
ECHO_CONFIRM_S, SETTLED_WAIT_S = 5.0, 0.5
UNCLAIMED_MAX = 64  # echoes that came before their request asked for results: requests kept, results each
_FROM_ECHO, _FROM_REDIS = (metrics.RELAYED_RESULTS.labels(source) for source in ("echo", "redis"))


class _Waiting:
    """One request's stream: where the reader is in it, and what it read that the request has not."""

    def __init__(self, last_id: str) -> None:
        self.last_id = last_id
        self.entries: list = []
        self.error: BaseException | None = None
        self.ready = asyncio.Event()
        self.finished = False  # its last result was read from Redis: no read asks for it again
        self.answered = False  # its last result was handed to the request (from Redis or an echo)
        self.read_count = 0  # entries Redis returned
        self.handed = 0  # results handed to the request, from either copy
        self.released_at: float | None = None  # released, read on until Redis shows its last result


class ResultReader:
    """The replica's reader of result streams (asyncio; bound to the loop that first uses it)."""

    def __init__(
        self,
        redis: aioredis.Redis,
        *,
        batch: int,
        block_ms: int,
        is_last: Callable[[Any], bool] = lambda fields: False,
        echoes: bool = False,
    ) -> None:
        """``is_last(fields)``: whether an entry is its stream's last one (never raises); ``echoes``:
        open an inbox for workers' result echoes (``echo_address``; Linux only)."""
        self.redis, self.batch, self.block_ms, self.is_last = redis, batch, block_ms, is_last
        self._inbox = hints.open_inbox("gateway") if echoes else None
        self._inbox_loop: asyncio.AbstractEventLoop | None = None
        self._echoed_last: set[str] = set()  # streams whose last result came as an echo, not yet from Redis
        self._unclaimed: dict[str, list[hints.ResultEcho]] = {}  # echoes that came before their request asked
        self._settled = asyncio.Event()
        self._settled.set()
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
        if waiting is None or waiting.released_at is not None:
            waiting = self._streams[key] = _Waiting(last_id)
            self._confirmed(key)
            for echo in self._unclaimed.pop(key, ()):
                self._hand(key, waiting, echo)
        elif waiting.answered and not waiting.entries:  # asked past its last result: read it again
            waiting.finished = waiting.answered = False
            self._confirmed(key)
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
        return any(not w.answered and w.released_at is None for w in self._streams.values())

    @property
    def echo_address(self) -> str:
        """The inbox workers echo results to ("": none)."""
        return "" if self._inbox is None else self._inbox.address

    def release(self, key: str) -> None:
        """The request is done with ``key`` (relayed to its end, failed or cancelled)."""
        waiting = self._streams.get(key)
        if waiting is not None and key in self._echoed_last:  # read on until Redis shows its last result
            waiting.released_at, waiting.entries = time.monotonic(), []
        else:
            self._streams.pop(key, None)

    async def settled(self) -> None:
        """Wait until Redis shows the last result of every request this replica answered from an
        echo (SETTLED_WAIT_S at most): the quota settlement the worker sent with it is in then."""
        if self._settled.is_set():
            return
        self._ensure_running()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(SETTLED_WAIT_S):
                await self._settled.wait()

    def _confirmed(self, key: str) -> None:
        """``key`` no longer waits for Redis to show an echoed last result."""
        self._echoed_last.discard(key)
        if not self._echoed_last:
            self._settled.set()

    def _ensure_running(self) -> None:
        loop = asyncio.get_running_loop()
        if self._inbox is not None and self._inbox_loop is None:
            loop.add_reader(self._inbox.fileno(), self._on_echoes)
            self._inbox_loop = loop
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run(), name="result-reader")

    def _on_echoes(self) -> None:
        """Hand each waiting request the echoes that are its next result (the others: late copies);
        keep those of a request that has not asked yet (its admission's reply came after its step)."""
        assert self._inbox is not None
        for payload in self._inbox.receive():
            echo = hints.parse_echo(payload)
            if echo is None:
                continue
            key = out_key(echo.request_id)
            target = self._streams.get(key)
            if target is None:  # kept for a while: UNCLAIMED_MAX requests, each's first UNCLAIMED_MAX results
                kept = self._unclaimed.setdefault(key, [])
                if len(kept) < UNCLAIMED_MAX:
                    kept.append(echo)
                while len(self._unclaimed) > UNCLAIMED_MAX:  # of requests that never asked: the oldest go
                    del self._unclaimed[next(iter(self._unclaimed))]
            elif self._hand(key, target, echo):
                target.ready.set()

    def _hand(self, key: str, target: _Waiting, echo: hints.ResultEcho) -> bool:
        """Hand ``echo`` to its request if it is the next result and its last; whether it was."""
        if target.released_at is not None or echo.seq != target.handed or not self.is_last(echo.fields):
            return False
        path_marks.mark("results_in")
        _FROM_ECHO.inc()
        target.handed += 1
        target.entries.append((ECHO_ENTRY_ID, echo.fields))
        target.answered = True
        if not target.finished:
            self._echoed_last.add(key)
            self._settled.clear()
        return True

    def _forget_unconfirmed(self) -> None:
        """Stop reading released streams that waited ECHO_CONFIRM_S for Redis to show their last result."""
        cutoff = time.monotonic() - ECHO_CONFIRM_S
        for key in [k for k, w in self._streams.items() if (w.released_at or cutoff) < cutoff]:
            del self._streams[key]
            self._confirmed(key)

    async def _run(self) -> None:
        while True:
            if self._echoed_last:
                self._forget_unconfirmed()
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
                for key in [k for k, w in self._streams.items() if w.released_at is not None]:
                    del self._streams[key]  # released: nobody to tell, and Redis cannot show it now
                    self._confirmed(key)
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
                    self._take(key, target, entries)
        self._reading = set()

    def _take(self, key: str, target: _Waiting, entries: list) -> None:
        """Entries Redis returned for ``key``: those not handed already as echoes go to the request."""
        target.last_id = entries[-1][0]
        handed = False
        for entry in entries:
            position, target.read_count = target.read_count, target.read_count + 1
            last = self.is_last(entry[1])
            target.finished = target.finished or last
            if position < target.handed:  # came as an echo
                continue
            target.handed, handed = position + 1, True
            _FROM_REDIS.inc()
            target.answered = target.answered or last
            if target.released_at is None:
                target.entries.append(entry)
        if target.finished:
            self._confirmed(key)
            if target.released_at is not None:
                del self._streams[key]
        if handed and target.released_at is None:
            path_marks.mark("results_in")
            target.ready.set()

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
        self._unclaimed.clear()
        self._echoed_last.clear()
        self._settled.set()
        if self._inbox is not None:
            if self._inbox_loop is not None and not self._inbox_loop.is_closed():
                self._inbox_loop.remove_reader(self._inbox.fileno())
            self._inbox_loop = None
            self._inbox.close()
            self._inbox = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        with contextlib.suppress(Exception):
            await self.redis.delete(self.wake_key)
        if self._lean is not None:
            await self._lean.aclose()
