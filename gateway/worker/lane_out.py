"""The worker's way out of its lanes (``LaneOut``, the part of ``gateway.worker.lane_io.LaneIO``
that writes): ``publish``: results, ACKs, the load, the tenants' virtual counters, quota
settlements and the cancel marks of requests in flight, in one MULTI/EXEC round trip, retried
through a Redis outage for as long as the worker runs (``stop`` not set): tokens a step produced
must not be dropped; and the housekeeping of the workers' loads and the lanes' consumers.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import redis as redislib
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.lanes import hints
from gateway.lanes.keys import GROUP, WORKER_FORGOTTEN_S, as_text, cancel_key, out_key
from gateway.lanes.messages import LaneResult, LoadReport, MessageError
from quotas import settlement as quota_settlement

log = logging.getLogger(__name__)
RETRY_FIRST_S, RETRY_MAX_S = 0.05, 1.0  # backoff: doubles from the first wait up to the longest
CONSUMER_IDLE_MS = 600_000  # a consumer with nothing pending, idle this long, belongs to a dead worker


class LaneOut:
    """LaneIO's writes; LaneIO sets these attributes."""

    redis: redislib.Redis
    worker_id: str
    lanes: list[str]
    load_key: str
    result_ttl_s: int
    fair: bool
    fair_keys: dict[str, tuple[str, str]]  # lane -> its backlog and its counters
    stop: threading.Event
    _echoes: hints.Sender  # result echoes to gateways' inboxes

    def publish(
        self,
        results: Sequence[LaneResult] = (),
        *,
        done: Sequence[tuple[str, str | None]] = (),
        load: str | None = None,
        watch: Sequence[str] = (),
        served: Mapping[tuple[str, str], float] | None = None,
        settlements: Sequence[tuple[bytes | str, int]] = (),
        echoes: Sequence[tuple[int, str, int]] = (),
    ) -> list[bool]:
        """One MULTI/EXEC: each result appended to its request's result stream (expiry renewed),
        each ``done`` (lane, entry id) ACKed and deleted (None: Redis lost it, nothing to ACK), the
        encoded load, each ``served`` (lane, tenant): output service added to the tenant's virtual
        counter of the lane (fair takes only: take.lua charged the prompt), each of ``settlements``
        (a lane entry's quota settlement, tokens used) settled; returns whether each request of
        ``watch`` has a cancel mark.

        Each of ``echoes`` (a last result's position in ``results``, its gateway's inbox, its
        position in its result stream) is sent to that inbox first (gateway/lanes/hints.py): the
        gateway has it while this transaction is built, sent and run."""
        encoded: list[dict[Any, Any]] = [result.encode() for result in results]
        for at, address, seq in echoes:  # never blocks or raises: a datagram not sent is not echoed
            self._echoes.send(address, hints.result_echo(results[at].request_id, seq, encoded[at]))
        pipe = self.redis.pipeline(transaction=True)
        for result, fields in zip(results, encoded, strict=True):
            key = out_key(result.request_id)
            pipe.xadd(key, fields)
            pipe.expire(key, self.result_ttl_s)
        for lane, entry_id in done:
            if entry_id is not None:
                pipe.xack(lane, GROUP, entry_id)
                pipe.xdel(lane, entry_id)
        if load is not None:
            pipe.hset(self.load_key, self.worker_id, load)
        for (lane, tenant), service in (served or {}).items() if self.fair else ():
            if service and lane in self.fair_keys:
                backlog, counters = self.fair_keys[lane]
                pipe.hincrbyfloat(counters, tenant, service)
                pipe.zadd(backlog, {tenant: service}, xx=True, incr=True)  # while it waits there
        settles = []  # (position in the transaction, KEYS, ARGV)
        for spec, used in settlements:
            keys, args = quota_settlement.settle_call(spec, used)
            settles.append((len(pipe), keys, args))
            pipe.evalsha(quota_settlement.SHA, len(keys), *keys, *args)
        if watch:
            pipe.mget([cancel_key(request_id) for request_id in watch])
        if not len(pipe):
            return []
        replies = self._execute(pipe, raise_on_error=not settles)
        if settles:
            self._settle_again(replies, settles)
        return [flag is not None for flag in replies[-1]] if watch else []

    def _settle_again(self, replies: list, settles: list[tuple[int, list[str], list[Any]]]) -> None:
        """Settle with the script's text where Redis did not know it (restarted or flushed:
        NOSCRIPT), once the transaction is through; any other error is the transaction's."""
        at = {position for position, _, _ in settles}
        failed = next((r for i, r in enumerate(replies) if i not in at and isinstance(r, Exception)), None)
        if failed is not None:
            raise failed
        for position, keys, args in settles:
            error = replies[position]
            if isinstance(error, NoScriptError):
                try:
                    self.redis.eval(quota_settlement.SOURCE, len(keys), *keys, *args)
                    continue
                except (RedisConnectionError, RedisTimeoutError, OSError) as exc:  # the results are out
                    error = exc
            if isinstance(error, Exception):  # its lease expires by itself (the quota's lease_ttl)
                log.error("quota settlement by the worker failed: %s", error)

    def _execute(self, pipe: Any, *, raise_on_error: bool = True) -> list:
        """Run a pipeline, retrying with backoff through a Redis outage for as long as the worker
        runs. A MULTI/EXEC retried after an unanswered EXEC may apply twice, which readers
        tolerate (results carry offsets)."""
        commands = list(pipe.command_stack)  # execute() empties the stack, even when it fails
        wait = RETRY_FIRST_S
        while True:
            try:
                return pipe.execute(raise_on_error=raise_on_error)
            except (RedisConnectionError, RedisTimeoutError) as exc:
                if self.stop.is_set():
                    raise
                log.warning("redis unavailable (%s); publishing again in %.2f s", exc, wait)
                self.stop.wait(wait)
                wait = min(wait * 2, RETRY_MAX_S)
                pipe.reset()
                pipe.command_stack.extend(commands)

    # ---- housekeeping ----------------------------------------------------------------------
    def write_load(self, encoded: str) -> None:
        self.redis.hset(self.load_key, self.worker_id, encoded)

    def withdraw_load(self) -> None:
        """Remove this worker's load (at exit), so gateways stop counting on it at once."""
        self.redis.hdel(self.load_key, self.worker_id)

    def prune_loads(self) -> int:
        """Drop the loads of workers that stopped publishing long ago (dead ones)."""
        cutoff, stale = time.time() - WORKER_FORGOTTEN_S, []
        for worker, raw in self.redis.hgetall(self.load_key).items():
            try:
                if LoadReport.decode(raw).at < cutoff:
                    stale.append(worker)
            except MessageError:
                stale.append(worker)
        if stale:
            self.redis.hdel(self.load_key, *stale)
        return len(stale)

    def prune_consumers(self, *, idle_ms: int = CONSUMER_IDLE_MS) -> int:
        """Forget consumers (dead workers) with nothing pending that were idle for ``idle_ms``."""
        pruned = 0
        for lane in self.lanes:
            for consumer in self.redis.xinfo_consumers(lane, GROUP):
                name = as_text(consumer["name"])
                if name != self.worker_id and consumer["pending"] == 0 and consumer["idle"] >= idle_ms:
                    self.redis.xgroup_delconsumer(lane, GROUP, name)
                    pruned += 1
        return pruned
