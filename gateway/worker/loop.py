"""The worker bridge: lanes on Redis in, engine steps, tokens back out. The only place where lanes
meet the engine.

Each iteration: claim entries a dead worker left pending, pull new entries (highest tier first)
while the engine has room, run one engine step, then publish every new token of every request,
ACK finished entries and read cancel marks, all in one MULTI/EXEC round trip. With an SLO-aware
policy the same round trip refreshes, every ~50 ms, the engine's load in ``load:{model}`` for the
gateways' door check, and a request the engine refuses for its TTFT target (on arrival or at a
step start) is published as an error result with code ``slo_unattainable`` and its retry-after.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis as redislib
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from engine import Engine, EngineError, ErrorCode, LoRARequest, RequestOutput
from engine.lora import AdapterNotFoundError
from gateway.adapters.store import AdapterStore, default_adapter_dir
from gateway.lanes.keys import (
    GROUP,
    WORKER_FORGOTTEN_S,
    cancel_key,
    lane_key,
    load_key,
    out_key,
    tier_priorities,
)
from gateway.lanes.messages import LaneRequest, LaneResult, LoadReport, MessageError
from gateway.telemetry import metrics, tracing
from gateway.worker.telemetry import EngineMetrics, RequestTrace

log = logging.getLogger(__name__)
RETRY_FIRST_S, RETRY_MAX_S = 0.05, 1.0  # backoff: doubles from the first wait up to the longest
PRUNE_EVERY_S = 60.0  # how often dead consumers and stale loads are removed
CONSUMER_IDLE_MS = 600_000  # a consumer with nothing pending, idle this long, belongs to a dead worker
CLAIMS_PER_IDLE = 4  # look for a dead worker's entries this many times per claim_idle_ms
LOAD_EVERY_S = 0.05  # how often the engine's load is published (SLO-aware policies only)
BLOCK_MS = 100  # an idle worker waits on its lanes this long per iteration


class AdapterGone(EngineError):
    """The request's adapter is no longer in the store (deleted after the gateway checked it)."""

    code = ErrorCode.MODEL_NOT_FOUND


@dataclass
class InFlight:
    lane: str
    entry_id: str | None  # None: Redis lost the entry (restarted empty); nothing to ACK
    offset: int  # output tokens published so far, resumed ones included
    trace: RequestTrace | None = None  # its spans on this worker (None while tracing is off)
    choice_offsets: dict[int, int] = field(
        default_factory=dict
    )  # the same for choices 1.. of an n > 1 request

    def offset_of(self, index: int) -> int:
        return self.offset if index == 0 else self.choice_offsets.get(index, 0)

    def advance(self, index: int, num_tokens: int) -> None:
        if index == 0:
            self.offset += num_tokens
        else:
            self.choice_offsets[index] = self.choice_offsets.get(index, 0) + num_tokens


class Worker:
    """Feeds one engine from the lanes of one model; see the module docstring for one iteration."""

    def __init__(
        self,
        engine: Engine,
        redis: redislib.Redis,
        *,
        model: str,
        tiers: list[str],
        worker_id: str,
        result_ttl_s: int = 300,
        claim_idle_ms: int = 3000,
        block_ms: int = BLOCK_MS,
        adapter_dir: str | Path | None = None,
    ) -> None:
        self.engine, self.redis, self.model, self.worker_id = engine, redis, model, worker_id
        self.lanes = [lane_key(model, tier) for tier in tiers]  # highest tier first
        self.priorities = {lane_key(model, tier): p for tier, p in tier_priorities(tiers).items()}
        self.load_key = load_key(model)
        self._last_load = float("-inf")
        self.result_ttl_s, self.claim_idle_ms, self.block_ms = result_ttl_s, claim_idle_ms, block_ms
        self.inflight: dict[str, InFlight] = {}
        self.adapters = AdapterStore(
            adapter_dir or default_adapter_dir()
        )  # uploaded LoRA adapters, by digest
        self.lock = threading.Lock()  # guards inflight against the heartbeat thread's reads
        self._last_claim = 0.0
        self._last_prune = time.monotonic()
        self.metrics = EngineMetrics(engine, worker_id)
        self.stop = threading.Event()  # set by run()'s caller: ends retries too
        self._lost: set[tuple[str, str]] = set()  # (lane, entry id) the heartbeat found gone from the group

    def setup(self) -> None:
        for lane in self.lanes:
            try:
                self.redis.xgroup_create(lane, GROUP, id="0", mkstream=True)
            except redislib.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    def owned_entries(self) -> dict[str, list[str]]:
        """Lane → entry ids this worker is running (the heartbeat keeps them claimed)."""
        with self.lock:
            owned: dict[str, list[str]] = {}
            for f in self.inflight.values():
                if f.entry_id is not None:
                    owned.setdefault(f.lane, []).append(f.entry_id)
            return owned

    def run(self, stop: threading.Event) -> None:
        """Iterate until ``stop``; a Redis outage pauses the loop (backoff), never ends it."""
        self.stop = stop
        wait, ready = RETRY_FIRST_S, False
        while not stop.is_set():
            try:
                if not ready:
                    self.setup()
                    ready = True
                self.run_once()
                wait = RETRY_FIRST_S
            except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
                log.warning("redis unavailable (%s); retrying in %.2f s", exc, wait)
                ready = False  # a restarted Redis may have lost the consumer groups
                stop.wait(wait)
                wait = min(wait * 2, RETRY_MAX_S)
            except redislib.ResponseError as exc:
                if "NOGROUP" not in str(exc) and "UNBLOCKED" not in str(exc):  # UNBLOCKED: a lane deleted
                    raise
                log.warning("consumer group or lane missing (Redis restarted?); re-creating it: %s", exc)
                ready = False

    def _execute(self, pipe) -> list:
        """Run a pipeline, retrying with backoff through a Redis outage for as long as the worker
        runs: tokens an engine step produced must not be dropped. A MULTI/EXEC retried after an
        unanswered EXEC may apply twice, which readers tolerate (results carry offsets)."""
        commands = list(pipe.command_stack)  # execute() empties the stack, even when it fails
        wait = RETRY_FIRST_S
        while True:
            try:
                return pipe.execute()
            except (RedisConnectionError, RedisTimeoutError) as exc:
                if self.stop.is_set():
                    raise
                log.warning("redis unavailable (%s); publishing again in %.2f s", exc, wait)
                self.stop.wait(wait)
                wait = min(wait * 2, RETRY_MAX_S)
                pipe.reset()
                pipe.command_stack.extend(commands)

    def mark_lost(self, lane: str, entry_ids: list[str]) -> None:
        """Entries the heartbeat could not re-claim: gone from the group (called from its thread)."""
        with self.lock:
            self._lost.update((lane, e) for e in entry_ids)

    def _forget_lost(self) -> None:
        """Running requests whose lane entries Redis lost go on without one (nothing to ACK)."""
        with self.lock:
            lost, self._lost = self._lost, set()
            for rid, f in self.inflight.items():
                if (f.lane, f.entry_id) in lost:
                    log.warning("request %s lost its lane entry %s (Redis restarted?)", rid, f.entry_id)
                    f.entry_id = None

    def run_once(self) -> None:
        """One iteration: admit work, step the engine, publish."""
        if self._lost:
            self._forget_lost()
        self._claim_dead()
        admitted = self._pull(block=False)
        if not self.engine.has_unfinished():
            if not admitted and not self._pull(block=True):
                self.publish_load()  # idle: keep the load fresh for the gateways
                return
        self._publish(self.engine.step())
        self.metrics.update()

    # ---- load, for the gateways' SLO door check ------------------------------------------
    def _load(self, *, force: bool = False) -> str | None:
        """The engine's load, encoded, when it is due (every LOAD_EVERY_S); None without an SLO policy."""
        now = time.monotonic()
        if not force and now - self._last_load < LOAD_EVERY_S:
            return None
        load = self.engine.slo_load()
        if load is None:
            return None
        self._last_load = now
        return LoadReport(worker=self.worker_id, load=load).encode()

    def publish_load(self, *, force: bool = False) -> None:
        """Write the engine's load to load:{model} now if it is due (or ``force``)."""
        encoded = self._load(force=force)
        if encoded is not None:
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

    # ---- admission -------------------------------------------------------------------------
    def _pull(self, *, block: bool) -> int:
        admitted = 0
        if block:  # idle: wait on every lane at once
            reply = self.redis.xreadgroup(
                GROUP, self.worker_id, {lane: ">" for lane in self.lanes}, count=1, block=self.block_ms
            )
            for lane, entries in sorted(reply or [], key=lambda r: self.lanes.index(_s(r[0]))):
                for entry_id, fields in entries:
                    admitted += self._start(_s(lane), _s(entry_id), fields, claimed=False)
            return admitted
        for lane in self.lanes:
            while self.engine.has_room():
                reply = self.redis.xreadgroup(GROUP, self.worker_id, {lane: ">"}, count=1)
                if not reply or not reply[0][1]:
                    break
                entry_id, fields = reply[0][1][0]
                admitted += self._start(lane, _s(entry_id), fields, claimed=False)
        return admitted

    def prune_consumers(self, *, idle_ms: int = CONSUMER_IDLE_MS) -> int:
        """Forget consumers (dead workers) with nothing pending that were idle for ``idle_ms``."""
        pruned = 0
        for lane in self.lanes:
            for consumer in self.redis.xinfo_consumers(lane, GROUP):
                name = _s(consumer["name"])
                if name != self.worker_id and consumer["pending"] == 0 and consumer["idle"] >= idle_ms:
                    self.redis.xgroup_delconsumer(lane, GROUP, name)
                    pruned += 1
        return pruned

    def _claim_dead(self) -> None:
        now = time.monotonic()
        if now - self._last_claim < self.claim_idle_ms / 1000 / CLAIMS_PER_IDLE:
            return
        self._last_claim = now
        if now - self._last_prune > PRUNE_EVERY_S:
            self._last_prune = now
            self.prune_consumers()
            self.prune_loads()
        for lane in self.lanes:
            while self.engine.has_room():
                _next, entries, *_ = self.redis.xautoclaim(
                    lane, GROUP, self.worker_id, min_idle_time=self.claim_idle_ms, count=1
                )
                entries = [e for e in entries if e and e[1]]
                if not entries:
                    break
                entry_id, fields = entries[0]
                log.warning("worker %s claims %s from a dead worker", self.worker_id, _s(entry_id))
                self._start(lane, _s(entry_id), fields, claimed=True)

    def _start(self, lane: str, entry_id: str, fields, *, claimed: bool) -> int:
        try:
            req = LaneRequest.decode(fields)
        except MessageError as exc:
            log.error("dropping unreadable lane entry %s: %s", entry_id, exc)
            self._ack(lane, entry_id)
            return 0
        pipe = self.redis.pipeline(transaction=False)
        pipe.exists(cancel_key(req.request_id))
        if claimed:  # what the dead worker already published is where we resume from
            pipe.xrange(out_key(req.request_id))
        replies = pipe.execute()
        cancelled, published = replies[0], replies[1] if claimed else []
        resume: list[int] = []
        for _id, result_fields in published:
            result = LaneResult.decode(result_fields)
            if result.done:  # it ended before its worker could ACK
                cancelled = True
            resume.extend(result.token_ids)
        if cancelled:
            self._ack(lane, entry_id)
            return 0
        # TTFT counts from the gateway's enqueue (time in the lane included); a resumed request's
        # first token was delivered long ago, so only its TPOT target still applies.
        taken_at = time.time()
        waited = max(0.0, taken_at - req.enqueued_at)
        if not claimed:
            metrics.LANE_QUEUE.labels(req.tier).observe(waited)
        trace = (
            RequestTrace(req, worker_id=self.worker_id, taken_at=taken_at, resumed_tokens=len(resume))
            if tracing.enabled()
            else None
        )
        try:
            self.engine.add(
                req.to_engine(
                    priority=self.priorities[lane],
                    arrival_time=time.monotonic() - waited,
                    resume_token_ids=tuple(resume),
                    lora=self._lora(req),
                )
            )
        except AdapterNotFoundError:  # deleted while the request waited in its lane: as if it never existed
            exc = AdapterGone(
                f"The model '{req.model}:{req.lora.name}' does not exist or you do not have access to it.",
                param="model",
            )
            if trace is not None:
                trace.refused(exc)
            self._ack(lane, entry_id, self._error(req.request_id, exc, offset=len(resume)))
            return 0
        except EngineError as exc:  # bad input, or SLOUnattainableError (it would miss its TTFT target)
            if trace is not None:
                trace.refused(exc)
            self._ack(lane, entry_id, self._error(req.request_id, exc, offset=len(resume)))
            return 0
        with self.lock:
            self.inflight[req.request_id] = InFlight(lane, entry_id, offset=len(resume), trace=trace)
        return 1

    def _lora(self, req: LaneRequest) -> LoRARequest | None:
        """The request's adapter as the engine takes it: its folder in the shared store."""
        if req.lora is None:
            return None
        return LoRARequest(
            name=f"{req.lora.id}:{req.lora.name}", path=str(self.adapters.path(req.lora.sha256))
        )

    def _ack(self, lane: str, entry_id: str | None, result: LaneResult | None = None) -> None:
        pipe = self.redis.pipeline(transaction=True)
        if result is not None:
            pipe.xadd(out_key(result.request_id), result.encode())
            pipe.expire(out_key(result.request_id), self.result_ttl_s)
        if entry_id is not None:
            pipe.xack(lane, GROUP, entry_id)
            pipe.xdel(lane, entry_id)
        if len(pipe):
            self._execute(pipe)

    # ---- results ---------------------------------------------------------------------------
    def _error(
        self, request_id: str, exc: Exception, *, offset: int = 0, num_prompt_tokens: int = 0
    ) -> LaneResult:
        """An engine refusal as a finished error result (retry_after_s for SLO refusals)."""
        return LaneResult(
            request_id=request_id,
            kind="error",
            done=True,
            offset=offset,
            worker=self.worker_id,
            num_prompt_tokens=num_prompt_tokens,
            error_message=getattr(exc, "message", str(exc)),
            error_param=getattr(exc, "param", None),
            error_code=str(getattr(exc, "code", ErrorCode.ENGINE_ERROR)),
            retry_after_s=getattr(exc, "retry_after", None),
        )

    def _result(self, out: RequestOutput, f: InFlight) -> LaneResult:
        if out.error is not None:  # refused at a step start (SLO): no token was produced
            return self._error(
                out.request_id, out.error, offset=f.offset, num_prompt_tokens=out.num_prompt_tokens
            )
        text = out.new_text
        if self.engine.tokenizer is None:  # random-weight models have no tokenizer: show the ids
            text = "".join(f" t{t}" for t in out.new_token_ids)
        return LaneResult(
            request_id=out.request_id,
            token_ids=tuple(out.new_token_ids),
            text=text,
            offset=f.offset_of(out.index),
            done=out.done,
            finish_reason=out.finish_reason,
            num_prompt_tokens=out.num_prompt_tokens,
            index=out.index,
            num_output_tokens=out.num_output_tokens,
            worker=self.worker_id,
            logprobs=None if out.logprobs is None else tuple(out.logprobs),
            num_cached_tokens=out.num_cached_tokens,
            prompt_logprobs=None if out.prompt_logprobs is None else tuple(out.prompt_logprobs),
        )

    def _publish(self, outputs: list[RequestOutput]) -> None:
        pipe = self.redis.pipeline(transaction=True)
        with self.lock:
            for out in outputs:
                f = self.inflight.get(out.request_id)
                if f is None:  # aborted since it was scheduled
                    continue
                if f.trace is not None:
                    f.trace.events(out.events)
                    if out.done:
                        f.trace.finish(
                            out, status=out.finish_reason or "error", num_output_tokens=out.num_output_tokens
                        )
                key = out_key(out.request_id)
                pipe.xadd(key, self._result(out, f).encode())
                pipe.expire(key, self.result_ttl_s)
                f.advance(out.index, len(out.new_token_ids))
                if out.done:
                    if f.entry_id is not None:
                        pipe.xack(f.lane, GROUP, f.entry_id)
                        pipe.xdel(f.lane, f.entry_id)
                    del self.inflight[out.request_id]
            running = list(self.inflight)
        load = self._load()
        if load is not None:
            pipe.hset(self.load_key, self.worker_id, load)
        if running:
            pipe.mget([cancel_key(rid) for rid in running])
        replies = self._execute(pipe) if len(pipe) else []
        if running:
            for rid, flag in zip(running, replies[-1]):
                if flag is not None:
                    self._cancel(rid)

    def _cancel(self, request_id: str) -> None:
        events = self.engine.take_events(request_id)
        self.engine.abort(request_id)  # frees its blocks now
        with self.lock:
            f = self.inflight.pop(request_id)
        if f.trace is not None:
            f.trace.events(events)
            f.trace.aborted()
        result = LaneResult(
            request_id=request_id,
            done=True,
            finish_reason="abort",
            offset=f.offset,
            worker=self.worker_id,
        )
        self._ack(f.lane, f.entry_id, result)


def _s(value) -> str:
    return value.decode() if isinstance(value, bytes) else value
