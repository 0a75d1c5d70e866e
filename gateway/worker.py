"""The worker bridge: lanes on Redis in, engine steps, tokens back out. The only place where lanes
meet the engine.

Each iteration: claim entries a dead worker left pending, pull new entries (highest tier first)
while the engine has room, run one engine step, then publish every new token of every request,
ACK finished entries and read cancel marks, all in one MULTI/EXEC round trip.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import asdict, dataclass

import redis as redislib

from engine import Engine, EngineError, RequestOutput, SamplingParams
from gateway.lanes import GROUP, cancel_key, lane_key, out_key
from gateway.messages import LaneRequest, LaneResult, MessageError

log = logging.getLogger(__name__)
PUBLISH_RETRIES = 8  # about 5 s of backoff in all
PRUNE_EVERY_S = 60.0


@dataclass
class InFlight:
    lane: str
    entry_id: str
    offset: int  # output tokens published so far, resumed ones included


class Worker:
    """Feeds one engine from the lanes of one model; see the module docstring for one iteration."""

    def __init__(self, engine: Engine, redis: redislib.Redis, *, model: str, tiers: list[str], worker_id: str,
                 result_ttl_s: int = 300, claim_idle_ms: int = 3000, block_ms: int = 100) -> None:
        self.engine, self.redis, self.worker_id = engine, redis, worker_id
        self.lanes = [lane_key(model, tier) for tier in tiers]  # highest tier first
        self.priorities = {lane: len(tiers) - i for i, lane in enumerate(self.lanes)}
        self.result_ttl_s, self.claim_idle_ms, self.block_ms = result_ttl_s, claim_idle_ms, block_ms
        self.inflight: dict[str, InFlight] = {}
        self.lock = threading.Lock()  # guards inflight against the heartbeat thread's reads
        self._last_claim = 0.0
        self._last_prune = time.monotonic()

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
                owned.setdefault(f.lane, []).append(f.entry_id)
            return owned

    def run(self, stop: threading.Event) -> None:
        self.setup()
        while not stop.is_set():
            self.run_once()

    def _execute(self, pipe) -> list:
        """Run a pipeline, retrying through a short Redis outage. Tokens an engine step produced
        must not be dropped; a MULTI/EXEC retried after an unanswered EXEC may apply twice, which
        readers tolerate (results carry offsets). After the retries the worker dies, and another
        one resumes its requests from what was published."""
        for attempt in range(PUBLISH_RETRIES):
            try:
                return pipe.execute()
            except (redislib.ConnectionError, redislib.TimeoutError) as exc:
                if attempt == PUBLISH_RETRIES - 1:
                    raise
                log.warning("redis unavailable (%s); retrying", exc)
                time.sleep(min(0.05 * 2**attempt, 1.0))
        raise AssertionError("unreachable")

    def run_once(self) -> None:
        """One iteration: admit work, step the engine, publish."""
        self._claim_dead()
        admitted = self._pull(block=False)
        if not self.engine.has_unfinished():
            if not admitted and not self._pull(block=True):
                return
        self._publish(self.engine.step())

    # ---- admission -------------------------------------------------------------------------
    def _pull(self, *, block: bool) -> int:
        admitted = 0
        if block:  # idle: wait on every lane at once
            reply = self.redis.xreadgroup(GROUP, self.worker_id, {lane: ">" for lane in self.lanes},
                                          count=1, block=self.block_ms)
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

    def prune_consumers(self, *, idle_ms: int = 600_000) -> int:
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
        if now - self._last_claim < self.claim_idle_ms / 4000:
            return
        self._last_claim = now
        if now - self._last_prune > PRUNE_EVERY_S:
            self._last_prune = now
            self.prune_consumers()
        for lane in self.lanes:
            while self.engine.has_room():
                _next, entries, *_ = self.redis.xautoclaim(lane, GROUP, self.worker_id,
                                                           min_idle_time=self.claim_idle_ms, count=1)
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
            if result.finished:  # finished before its worker could ACK
                cancelled = True
            resume.extend(result.token_ids)
        if cancelled:
            self._ack(lane, entry_id)
            return 0
        try:
            params = SamplingParams(**asdict(req.sampling))
            self.engine.add_request(
                req.request_id, list(req.prompt_token_ids), params, tenant=req.tenant, weight=req.weight,
                priority=req.priority or self.priorities[lane], ttft_target_s=req.ttft_target_s,
                tpot_target_s=req.tpot_target_s, lora=req.lora, resume_token_ids=tuple(resume),
            )
        except EngineError as exc:
            error = LaneResult(request_id=req.request_id, kind="error", finished=True, worker=self.worker_id,
                               error_message=exc.message, error_param=exc.param, error_code=type(exc).code)
            self._ack(lane, entry_id, error)
            return 0
        with self.lock:
            self.inflight[req.request_id] = InFlight(lane, entry_id, offset=len(resume))
        return 1

    def _ack(self, lane: str, entry_id: str, result: LaneResult | None = None) -> None:
        pipe = self.redis.pipeline(transaction=True)
        if result is not None:
            pipe.xadd(out_key(result.request_id), result.encode())
            pipe.expire(out_key(result.request_id), self.result_ttl_s)
        pipe.xack(lane, GROUP, entry_id)
        pipe.xdel(lane, entry_id)
        self._execute(pipe)

    # ---- results ---------------------------------------------------------------------------
    def _result(self, out: RequestOutput, f: InFlight) -> LaneResult:
        text = out.new_text
        if self.engine.tokenizer is None:  # random-weight models have no tokenizer: show the ids
            text = "".join(f" t{t}" for t in out.new_token_ids)
        return LaneResult(
            request_id=out.request_id, token_ids=tuple(out.new_token_ids), text=text, offset=f.offset,
            finished=out.finished, finish_reason=out.finish_reason, num_prompt_tokens=out.num_prompt_tokens,
            num_output_tokens=out.num_output_tokens, worker=self.worker_id,
        )

    def _publish(self, outputs: list[RequestOutput]) -> None:
        pipe = self.redis.pipeline(transaction=True)
        with self.lock:
            for out in outputs:
                f = self.inflight.get(out.request_id)
                if f is None:  # aborted since it was scheduled
                    continue
                key = out_key(out.request_id)
                pipe.xadd(key, self._result(out, f).encode())
                pipe.expire(key, self.result_ttl_s)
                f.offset += len(out.new_token_ids)
                if out.finished:
                    pipe.xack(f.lane, GROUP, f.entry_id)
                    pipe.xdel(f.lane, f.entry_id)
                    del self.inflight[out.request_id]
            running = list(self.inflight)
        if running:
            pipe.mget([cancel_key(rid) for rid in running])
        replies = self._execute(pipe) if len(pipe) else []
        if running:
            for rid, flag in zip(running, replies[-1]):
                if flag is not None:
                    self._cancel(rid)

    def _cancel(self, request_id: str) -> None:
        self.engine.abort(request_id)  # frees its blocks now
        with self.lock:
            f = self.inflight.pop(request_id)
        result = LaneResult(request_id=request_id, finished=True, finish_reason="abort", offset=f.offset,
                            worker=self.worker_id)
        self._ack(f.lane, f.entry_id, result)


def _s(value) -> str:
    return value.decode() if isinstance(value, bytes) else value
