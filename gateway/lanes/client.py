"""The gateway's side of the lanes protocol (gateway/lanes/keys.py): submit a request to its lane,
relay its results, cancel it, and know whether a worker serves the model.

The relay never waits silently: while no result comes it yields ``None`` every ``keepalive_s``
(the SSE relay turns it into a comment line), gives up with ``ResultTimeout`` past its bound,
and raises ``QueueUnavailable`` when Redis stays unreachable past the client's own retries, or
when Redis restarted empty while the request waited (the ``lanes:epoch`` key, set by the first
client to find it missing, changed: the request was lost with the rest of Redis's data).
A cancel that Redis cannot take now is retried in the background until it can.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.lanes import hints
from gateway.lanes.keys import (
    WORKER_ALIVE_S,
    WORKER_INBOX_FIELD,
    as_text,
    cancel_key,
    lane_key,
    out_key,
    worker_info_key,
    workers_key,
)
from gateway.lanes.messages import LaneRequest, LaneResult, MessageError
from gateway.lanes.result_reader import ResultReader

WORKER_SEEN_S = 1.0  # a replica trusts a live worker it saw this long without asking Redis again
RELAY_BATCH = 256  # result entries read per XREAD (a request's whole output, usually)
POLL_MS = 1000  # one blocking XREAD waits this long before the timeout is checked again
EPOCH_KEY = "lanes:epoch"  # a random value; a Redis restarted empty lacks it (or has a newer one)
CANCEL_RETRY_S, CANCEL_RETRY_FOR_S = 1.0, 60.0  # a cancel Redis refused is retried this often, this long
# Relayed requests' result streams are dropped together, one UNLINK at most this often: one command
# for every request that ended meanwhile instead of one each (a stream outlives its relay by this
# much at most; one that a failed UNLINK leaves behind expires after result_ttl_s).
DISCARD_EVERY_S = 0.05
log = logging.getLogger(__name__)


def _raise_if_cancelled() -> None:
    """Raise CancelledError when this task was cancelled and something swallowed it: Python 3.11's
    ``asyncio.wait_for`` returns the result instead when the awaited work ends as the cancel comes
    (redis-py sends every command of a client with a socket timeout under ``wait_for``), and a relay
    that missed its client's going would wait out its whole timeout, then be settled as timed out
    or its worker lost instead of cancelled."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


class ResultTimeout(Exception):
    """No result arrived for a request within the wait limit."""


class QueueUnavailable(Exception):
    """Redis did not answer while a request's results were relayed (after the client's retries)."""


class LaneClient:
    """Submit requests to lanes, relay their results, cancel them (async, one per gateway)."""

    def __init__(
        self,
        redis: aioredis.Redis,
        *,
        result_ttl_s: int = 300,
        poll_ms: int = POLL_MS,
        early_start: bool = False,
        result_echoes: bool = True,
    ) -> None:
        """``early_start``: hint a model's only worker, when it has an inbox on this host
        (gateway/lanes/hints.py), before each admission; ``result_echoes``: and have it echo the
        hinted request's last result to this replica (only where the client's next request comes back
        to this replica: the admission of that request waits for the echoed one's settlement)."""
        self.redis = redis
        self.early_start = early_start and hints.supported()
        self._inboxes: dict[str, str] = {}  # model -> its only live worker's inbox (as last seen)
        self._held: dict[str, float] = {}  # tenant -> monotonic time its requests may be hinted again
        self._hints = hints.Sender()
        self.result_ttl_s = result_ttl_s
        self.poll_ms = poll_ms
        self._worker_seen: dict[str, float] = {}  # model → when a live worker was last seen (monotonic)
        self._epoch: str | None = None  # lanes:epoch as this replica last saw it
        self._epoch_read: asyncio.Future[str] | None = None
        self._epoch_check: asyncio.Future[Any] | None = None  # the in-flight GET of the epoch
        self._cancels: set[asyncio.Task] = set()
        self._discards: set[str] = set()  # result streams to drop with the next UNLINK
        self._discarder: asyncio.Task | None = None
        # every relay's XREAD
        self.reader = ResultReader(
            redis,
            batch=RELAY_BATCH,
            block_ms=poll_ms,
            is_last=LaneResult.is_last,
            echoes=self.early_start and result_echoes,
        )

    async def epoch(self) -> str:
        """The Redis data's epoch (set here if missing: first use, or a Redis restarted empty)."""
        while self._epoch is None:  # one read however many requests ask at once
            if self._epoch_read is None or self._epoch_read.done():
                self._epoch_read = asyncio.ensure_future(self._read_epoch())
            epoch = await asyncio.shield(self._epoch_read)
            if self._epoch is None:  # a restart was seen meanwhile: this read counts
                self._epoch = epoch
        return self._epoch

    async def _read_epoch(self) -> str:
        await self.redis.set(EPOCH_KEY, uuid.uuid4().hex, nx=True)
        value = await self.redis.get(EPOCH_KEY)
        return "" if value is None else as_text(value)  # "": deleted at once (a flush)

    async def _same_epoch(self, epoch: str) -> bool:
        # one GET however many relays ask at once: every relay whose read timed out in the same poll
        # asks together, and one connection each would drain the pool on a slow host
        if self._epoch_check is None or self._epoch_check.done():
            self._epoch_check = asyncio.ensure_future(self.redis.get(EPOCH_KEY))
        value = await asyncio.shield(self._epoch_check)
        if (value.decode() if isinstance(value, bytes) else value) == epoch:
            return True
        self._epoch = None  # the next request takes the new epoch
        return False

    @staticmethod
    def entry(request: LaneRequest) -> tuple[str, dict[str, str]]:
        """The lane stream and the stream entry of a request: what ``submit`` adds."""
        return lane_key(request.model, request.tier), request.encode()

    async def submit(self, request: LaneRequest) -> str:
        """XADD the request to its lane; returns the entry id."""
        lane, fields = self.entry(request)
        entry_id = await self.redis.xadd(lane, dict[Any, Any](fields))
        return as_text(entry_id)

    async def results(
        self,
        request_id: str,
        *,
        timeout_s: float,
        idle_timeout_s: float | None = None,
        keepalive_s: float | None = None,
        epoch: str | None = None,
        model: str | None = None,
    ) -> AsyncIterator[LaneResult | None]:
        """Every result of a request in order, until the last one (``done``); drops chunks already seen, and
        never skips any: a result past a gap (tokens lost with a restarted Redis) ends the relay.

        ``None`` every ``keepalive_s`` seconds without a result (when given). Raises ResultTimeout
        if nothing arrives for ``timeout_s`` seconds before the first result, ``idle_timeout_s``
        (default: the same) after it, and QueueUnavailable if Redis stops answering, is no
        longer at ``epoch`` (the one the request was queued at; default: this replica's now) or
        lost results. ``model``: before the first result, every ``idle_timeout_s`` the relay asks
        whether a worker of ``model`` is alive, and raises ResultTimeout when none is (its worker
        died and none came back, a crash loop): it does not wait out ``timeout_s`` for nobody.
        """
        key = out_key(request_id)
        try:
            async for result in self._results(
                key, request_id, timeout_s, idle_timeout_s, keepalive_s, epoch, model
            ):
                yield result
                if result is not None and result.done:
                    return
        finally:
            self.reader.release(key)

    async def _results(
        self,
        key: str,
        request_id: str,
        timeout_s: float,
        idle_timeout_s: float | None,
        keepalive_s: float | None,
        epoch: str | None,
        model: str | None,
    ) -> AsyncIterator[LaneResult | None]:
        last_id, idle_ms, quiet_ms = "0-0", 0.0, 0.0
        relayed: dict[int, int] = {}  # choice index -> output tokens relayed
        limit_s = timeout_s
        # before the first result: when (ms waited) to ask next whether a worker of the model lives
        ask_ms = idle_timeout_s * 1000 if model and idle_timeout_s and idle_timeout_s < timeout_s else None
        while True:
            _raise_if_cancelled()
            try:
                epoch = epoch or await self.epoch()
                reply: Any = await self.reader.read(key, last_id, self.poll_ms)
                if not reply and not await self._same_epoch(epoch):
                    raise QueueUnavailable("Redis restarted and lost the request")
            except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
                raise QueueUnavailable(str(exc)) from exc
            if not reply:
                idle_ms += self.poll_ms
                quiet_ms += self.poll_ms
                if idle_ms >= limit_s * 1000:
                    raise ResultTimeout(f"no result for {request_id} in {limit_s:.0f} s")
                if ask_ms is not None and idle_ms >= ask_ms:
                    assert model is not None and idle_timeout_s is not None
                    ask_ms += idle_timeout_s * 1000
                    try:
                        alive = await self.has_worker(model, fresh=True)
                    except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
                        raise QueueUnavailable(str(exc)) from exc
                    if not alive:
                        raise ResultTimeout(
                            f"no result for {request_id} in {idle_ms / 1000:.0f} s and no live worker "
                            f"serves {model!r}"
                        )
                if keepalive_s is not None and quiet_ms >= keepalive_s * 1000:
                    quiet_ms = 0.0
                    yield None
                continue
            idle_ms = quiet_ms = 0.0
            limit_s, ask_ms = idle_timeout_s or timeout_s, None
            for entry_id, fields in reply[0][1]:
                last_id = entry_id
                result = LaneResult.decode(fields)
                end = result.offset + len(result.token_ids)
                if result.kind == "tokens" and end <= relayed.get(result.index, 0) and result.token_ids:
                    continue  # a chunk we have already relayed
                done_before = relayed.get(result.index, 0)
                if (
                    result.kind == "tokens" and result.offset > done_before
                ):  # e.g. a Redis restarted empty meanwhile
                    raise QueueUnavailable(
                        f"results {done_before}..{result.offset} of {request_id} were lost"
                    )
                relayed[result.index] = max(done_before, end)
                yield result
                if result.done:
                    return

    async def published(self, request_ids: list[str]) -> list[list[LaneResult]]:
        """Every result published so far for each request (its result stream as it stands), in one
        round trip; an entry that does not decode is left out."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for request_id in request_ids:
                pipe.xrange(out_key(request_id))
            replies = await pipe.execute()
        published = []
        for entries in replies:
            results = []
            for _entry_id, fields in entries:
                with contextlib.suppress(MessageError):
                    results.append(LaneResult.decode(fields))
            published.append(results)
        return published

    async def cancel(self, request_id: str) -> None:
        """Ask whichever worker holds the request to abort it (seen within one engine step)."""
        await self.redis.set(cancel_key(request_id), b"1", ex=self.result_ttl_s)

    def cancel_soon(self, request_id: str) -> None:
        """``cancel``, retried in the background while Redis does not answer (an outage)."""
        task = asyncio.ensure_future(self._cancel_until_done(request_id))
        self._cancels.add(task)
        task.add_done_callback(self._cancels.discard)

    async def _cancel_until_done(self, request_id: str) -> None:
        deadline = time.monotonic() + CANCEL_RETRY_FOR_S
        while True:
            try:
                await self.cancel(request_id)
                return
            except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
                if time.monotonic() > deadline:
                    log.warning("could not cancel %s: %s", request_id, exc)
                    return
                await asyncio.sleep(CANCEL_RETRY_S)

    async def aclose(self) -> None:
        """Wait for the background cancels, drop the result streams still to discard and stop the
        result reader (at shutdown)."""
        for task in list(self._cancels):
            task.cancel()
        await asyncio.gather(*self._cancels, return_exceptions=True)
        if self._discarder is not None:
            self._discarder.cancel()
            await asyncio.gather(self._discarder, return_exceptions=True)
        await self._flush_discards()
        await self.reader.aclose()
        self._hints.close()

    async def discard(self, request_id: str) -> None:
        """Drop a relayed request's result stream now."""
        await self.redis.delete(out_key(request_id))

    def discard_soon(self, request_id: str) -> None:
        """Drop a relayed request's result stream with the others of the next DISCARD_EVERY_S."""
        self._discards.add(out_key(request_id))
        if self._discarder is None or self._discarder.done():
            self._discarder = asyncio.ensure_future(self._discard_later())

    async def _discard_later(self) -> None:
        await asyncio.sleep(DISCARD_EVERY_S)
        await self._flush_discards()

    async def _flush_discards(self) -> None:
        keys, self._discards = self._discards, set()
        if not keys:
            return
        try:
            await self.redis.unlink(*keys)
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            log.warning("%d result streams left to expire (redis unavailable: %s)", len(keys), exc)

    async def has_worker(self, model: str, *, fresh: bool = False) -> bool:
        """Whether a worker serving ``model`` beat within WORKER_ALIVE_S (by Redis's clock).

        It is asked on every request: a live worker once seen is trusted for WORKER_SEEN_S, so
        Redis is asked at most about once a second per model while workers are up. A worker that
        dies meanwhile is like one dying just after the check: its requests wait in the lane.
        ``fresh``: ask Redis now (a relay that heard nothing for long asks whether a worker is left).
        """
        seen = time.monotonic()
        if not fresh and seen - self._worker_seen.get(model, float("-inf")) < WORKER_SEEN_S:
            return True
        async with self.redis.pipeline(transaction=False) as pipe:  # one round trip
            pipe.time()
            pipe.zrange(workers_key(model), -2, -1, withscores=True)  # the two latest beats
            (now_s, _), latest = await pipe.execute()
        alive = bool(latest) and latest[-1][1] >= now_s - WORKER_ALIVE_S
        if alive:
            self._worker_seen[model] = seen
            only = len(latest) == 1 or latest[0][1] < now_s - WORKER_ALIVE_S
            if self.early_start:
                await self._learn_inbox(model, as_text(latest[-1][0]) if only else None)
        return alive

    async def _learn_inbox(self, model: str, worker_id: str | None) -> None:
        """Where the model's only live worker (``worker_id``; None: several) takes hints, if anywhere."""
        address = None
        if worker_id is not None:
            address = await self.redis.hget(worker_info_key(model, worker_id), WORKER_INBOX_FIELD)
        if address:
            self._inboxes[model] = as_text(address)
        else:
            self._inboxes.pop(model, None)

    def hint(self, request: LaneRequest, lane: str, fields: dict[str, str]) -> bool:
        """Hand the model's only worker a copy of ``request``'s lane entry (``lane``, ``fields``)
        about to be queued (never waits); whether it was sent. Only while this replica relays no
        other request: the worker is idle then, unless other replicas keep it busy (a busy worker
        reads no hint; an idle one whose first entry is another's aborts its early step)."""
        if not self.early_start or self.reader.relaying:  # the worker is likely busy with those
            return False
        if len(request.prompt_token_ids) > hints.MAX_PROMPT_TOKENS or self._holding(request.tenant):
            return False
        address = self._inboxes.get(request.model)
        return address is not None and self._hints.send(
            address, hints.start_hint(lane, request.request_id, fields, self.reader.echo_address)
        )

    async def settled(self) -> None:
        """Before an admission: the quota settlements that rode with results this replica took
        from echoes are in Redis (ResultReader.settled)."""
        await self.reader.settled()

    def unhint(self, request: LaneRequest, *, refused_for_s: float | None = None) -> None:
        """The hinted request will not be queued (its admission failed, or refused it: then its
        tenant's requests are not hinted for ``refused_for_s``, its retry-after, 1 s at least, so
        that a tenant over its quota does not have the worker run steps for requests it is refused)."""
        address = self._inboxes.get(request.model)
        if address is not None:
            self._hints.send(address, hints.drop_hint(request.request_id))
        if refused_for_s is not None:
            if len(self._held) > 10_000:  # many tenants refused at once: forget the ones whose time is up
                now = time.monotonic()
                self._held = {t: until for t, until in self._held.items() if until > now}
            pause = max(hints.HOLD_AFTER_REFUSAL_S, refused_for_s)
            self._held[request.tenant] = time.monotonic() + pause

    def _holding(self, tenant: str) -> bool:
        until = self._held.get(tenant)
        if until is None:
            return False
        if time.monotonic() < until:
            return True
        del self._held[tenant]
        return False
