"""The worker bridge: lanes on Redis in, engine steps, tokens back out. The only place where lanes
meet the engine; its Redis I/O is gateway/worker/lane_io.py.

Each iteration: take every entry the engine has room for (a dead worker's left pending, then waiting
ones, highest tier first, the least-served tenant of a lane first) in one script call, read their
cancel marks in one round trip, hand them all to the engine, run one engine step, then publish
every new token of every request, the results of requests dropped or refused, ACK finished entries
and read cancel marks, all in one MULTI/EXEC round trip (cancelled requests' aborts go out in one
more). A worker whose engine is empty and whose last take left no entry in the lanes' backlogs
blocks on its lanes in one XREADGROUP, with no take before it, until an entry arrives or its next
look for a dead worker's entries is due (every claim_idle_ms / 4, BLOCK_MS at most): idle, one take
and one blocking read per period, no polling. The entries that wake it start at once when the lanes
hold nothing else: their cancel marks are read by the step's publish (a mark set in the moment they
waited costs one step, then the abort), not in a round trip before their first token. While it
waits, the worker also reads its inbox (gateway/lanes/hints.py): a gateway on its host hints a
request as its admission queues it, and the idle worker runs that request's first step at once,
binding it to its entry when the read returns that entry (byte for byte) and aborting it otherwise;
nothing of it is published before then. With
an SLO-aware policy the same round trip refreshes, every ~50 ms, the engine's load in
``load:{model}`` for the gateways' door check, and a request the engine refuses for its TTFT target
(on arrival or at a step start) is published as an error result with code ``slo_unattainable`` and
its retry-after.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import redis as redislib

from engine import Engine, EngineError, EngineRequest, ErrorCode, LoRARequest, RequestOutput, parse_policy
from engine.interrupts import Interrupt
from engine.lora import AdapterNotFoundError
from gateway.adapters.store import AdapterStore, default_adapter_dir
from gateway.lanes.hints import Inbox
from gateway.lanes.messages import LaneRequest, LaneResult, LoadReport, MessageError
from gateway.telemetry import metrics, path_marks, tracing
from gateway.worker.early_start import STARTED_REMEMBERED, EarlyStart, EarlyStarts
from gateway.worker.inflight import InFlight
from gateway.worker.lane_io import BLOCK_MS, LaneEntry, LaneIO, Prior
from gateway.worker.lane_out import RETRY_FIRST_S, RETRY_MAX_S
from gateway.worker.ownership import Reclaims
from gateway.worker.publishing import REDIS_DOWN, Publishing
from gateway.worker.results import error_result
from gateway.worker.telemetry import EngineMetrics, RequestTrace
from quotas import settlement as quota_settlement

log = logging.getLogger(__name__)
LOAD_EVERY_S = 0.05  # how often the engine's load is published (SLO-aware policies only)
INTERRUPT_POLL_S = 0.01  # while a step runs: how often the lanes are read for urgent prompts
SETTLEMENT = quota_settlement.FIELD.encode()  # a lane entry's field (as Redis returns it)


class AdapterGone(EngineError):
    """The request's adapter is no longer in the store (deleted after the gateway checked it)."""

    code = ErrorCode.MODEL_NOT_FOUND


class ChoicesLost(EngineError):
    """An n > 1 request whose dead worker had published tokens: the engine resumes one sequence
    from its tokens, not several choices, so the request ends (503, retry-after) instead."""

    code = ErrorCode.WORKER_LOST

    def __init__(self) -> None:
        super().__init__(
            "The engine worker running this request stopped after it had produced tokens, and a "
            "request with n > 1 cannot be resumed on another worker; retry it."
        )


class Worker(EarlyStarts, Publishing, Reclaims):
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
        inbox: Inbox | None = None,
    ) -> None:
        """``inbox``: where gateways on this host send early-start hints (gateway/lanes/hints.py)."""
        self.engine, self.model, self.worker_id = engine, model, worker_id
        self.lane_io = LaneIO(
            redis,
            model=model,
            tiers=tiers,
            worker_id=worker_id,
            result_ttl_s=result_ttl_s,
            claim_idle_ms=claim_idle_ms,
            block_ms=block_ms,
            w_in=engine.config.vtc_input_weight,
            fair="vtc" in parse_policy(engine.config.policy),
        )
        self.priorities = dict(zip(self.lane_io.lanes, self.lane_io.priorities))
        self._outbox: list[LaneResult] = []  # results of requests dropped, refused or aborted ...
        self._outbox_done: list[tuple[str, str | None]] = []  # ... and their entries, to ACK
        self._last_load = float("-inf")
        self.inflight: dict[str, InFlight] = {}
        self.adapters = AdapterStore(adapter_dir or default_adapter_dir())  # uploaded LoRA adapters
        self.lock = threading.Lock()  # guards inflight against the heartbeat thread's reads
        self.metrics = EngineMetrics(engine, worker_id, tiers)
        self._lost: set[tuple[str, str]] = set()  # (lane, entry id) the heartbeat found gone from the group
        self._taken: set[tuple[str, str]] = set()  # ... or claimed by another worker
        self._last_publish = time.monotonic()  # when the last step's publish began
        urgent = {"priority", "vtc"} & set(parse_policy(engine.config.policy))
        self._interrupt = Interrupt(poll=self._poll, deliver=self._deliver) if urgent else None
        self._last_poll = 0.0
        self.inbox = inbox
        self._early: EarlyStart | None = None  # a hinted request stepped before its entry came
        # the ids of the requests started last (their hints, read late, are stale): oldest first
        self._started: dict[str, None] = {}

    def setup(self) -> None:
        self.lane_io.setup()

    def run(self, stop: threading.Event) -> None:
        """Iterate until ``stop``; a Redis outage pauses the loop (backoff), never ends it."""
        self.lane_io.stop = stop
        wait, ready = RETRY_FIRST_S, False
        while not stop.is_set():
            try:
                if not ready:
                    self.setup()
                    ready = True
                self.run_once()
                wait = RETRY_FIRST_S
            except REDIS_DOWN as exc:
                log.warning("redis unavailable (%s); retrying in %.2f s", exc, wait)
                ready = False  # a restarted Redis may have lost the consumer groups
                stop.wait(wait)
                wait = min(wait * 2, RETRY_MAX_S)
            except redislib.ResponseError as exc:
                if "NOGROUP" not in str(exc) and "UNBLOCKED" not in str(exc):  # UNBLOCKED: a lane deleted
                    raise
                log.warning("consumer group or lane missing (Redis restarted?); re-creating it: %s", exc)
                ready = False

    def run_once(self) -> None:
        """One iteration: admit work, step the engine, publish."""
        if self._lost or self._taken:
            self._forget_lost()
        # An empty engine whose last take left no backlog blocks on the lanes at once: a take would
        # find nothing the read does not (until a dead worker's entries are due to be looked for).
        io, empty = self.lane_io, not self.engine.has_unfinished()
        admitted = 0 if empty and not io.backlogged and not io.claim_due() else self._admit(self._take())
        if not self.engine.has_unfinished() and not admitted:
            self._flush()  # what the take dropped or refused goes out before the worker waits
            try:
                woke = self.lane_io.wait(self.inbox, self._on_hints)
            except BaseException:
                self._drop_early()
                raise
            path_marks.mark("worker_entry")
            self._match_early(woke)
            if woke and self.lane_io.more:  # the rest of a burst joins the entries that woke the worker
                self._admit(woke, then_take=True)
            elif woke:  # the lanes held nothing else: start them now (the step's publish reads their
                self._admit(woke, fresh=True)  # cancel marks, one round trip before the first token fewer)
            self._publish_early()
        if not self.engine.has_unfinished():
            self._flush()
            self.publish_load()  # idle: keep the load fresh for the gateways
            return
        self._last_poll = time.monotonic()  # the take above was a poll
        if empty:  # what it runs now was taken just now: nobody can have claimed it yet
            self._last_publish = self._last_poll
        outputs = self.engine.step(self._interrupt)
        now = time.monotonic()
        if now - self._last_publish > self.lane_io.claim_idle_ms / 1000:  # frozen since, or cut off?
            self._check_ownership()
        self._last_publish = now
        self._publish(outputs)
        self.metrics.update()

    def _poll(self) -> None:
        """Between two layers of a step (engine/interrupts.py): take what the engine has room for,
        every INTERRUPT_POLL_S at most; an urgent prompt among it may start before the step ends."""
        now = time.monotonic()
        if now - self._last_poll >= INTERRUPT_POLL_S:
            self._last_poll = now
            try:
                self._admit(self._take())
            except (*REDIS_DOWN, redislib.ResponseError) as exc:  # never out of the step in flight
                # (a NOGROUP would leave it half run): the loop's next take retries or re-creates
                log.warning("no take inside the step: redis unavailable (%s)", exc)

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        """A nested step's outputs, published at once (with the step's own when Redis is down);
        cancel marks wait for the step's end (an abort cannot run inside a step)."""
        self._publish(outputs, watch_cancels=False)

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
            self.lane_io.write_load(encoded)

    def withdraw_load(self) -> None:
        self.lane_io.withdraw_load()

    # ---- admission -------------------------------------------------------------------------
    def _take(self) -> list[LaneEntry]:
        """Every lane entry the engine has room for (LaneIO.take), in one call."""
        return self.lane_io.take(self.engine.room(self.lane_io.priorities))

    def _admit(self, entries: list[LaneEntry], *, then_take: bool = False, fresh: bool = False) -> int:
        """Hand lane entries to the engine, their cancel marks read in one round trip; how many run.
        ``then_take``: the same round trip takes the entries the engine has room for beside them,
        which are admitted next (one more round trip). ``fresh``: new entries (none claimed from a
        dead worker) that just woke an idle worker: no round trip before they start; a cancel mark
        set in the moment they waited is read by the step's publish, which aborts them then (one
        step of work, the result nobody reads). Entries dropped or refused wait in the outbox for
        the step's publish."""
        requests: list[tuple[LaneEntry, LaneRequest]] = []
        early = self._early
        for entry in entries:
            if early is not None and early.entry is entry:  # the same bytes, decoded for the hint
                requests.append((entry, early.request))
                continue
            try:
                requests.append((entry, LaneRequest.decode(entry.fields)))
            except MessageError as exc:
                log.error("dropping unreadable lane entry %s: %s", entry.entry_id, exc)
                self._outbox_done.append((entry.lane, entry.entry_id))
        room = None
        if then_take:  # as if these entries were in the engine already
            room = self.engine.room(self.lane_io.priorities).after(
                (self.priorities[e.lane] for e, _ in requests),
                sum(len(r.prompt_token_ids) for _, r in requests),
            )
        elif not requests:
            return 0
        if fresh and not any(entry.claimed for entry, _ in requests):
            priors, more = [Prior(False, ())] * len(requests), []
        else:
            priors, more = self.lane_io.priors(
                [(request.request_id, entry.claimed) for entry, request in requests], take=room
            )
        admitted = 0
        for (entry, request), prior in zip(requests, priors):
            if prior.over:
                if self._early is not None and self._early.entry is entry:
                    self._drop_early()
                self._outbox_done.append((entry.lane, entry.entry_id))
            else:
                admitted += self._start(entry, request, prior)
        return admitted + (self._admit(more) if more else 0)

    def _start(self, entry: LaneEntry, request: LaneRequest, prior: Prior) -> int:
        """Hand one request to the engine; 1 if it runs, 0 if the engine refused it."""
        self._started[request.request_id] = None
        if len(self._started) > STARTED_REMEMBERED:
            del self._started[next(iter(self._started))]
        # TTFT counts from the gateway's enqueue (time in the lane included).
        early = self._early if self._early is not None and self._early.entry is entry else None
        taken_at = time.time() if early is None else early.taken_at  # an early start: in the engine
        waited = max(0.0, taken_at - request.enqueued_at)
        if not entry.claimed:
            metrics.LANE_QUEUE.labels(request.tier).observe(waited)
        resumed = len(prior.resume_token_ids)
        trace = (
            RequestTrace(
                request,
                worker_id=self.worker_id,
                taken_at=taken_at,
                resumed_tokens=resumed,
                speculative_method=self.engine.speculative_method,
            )
            if tracing.enabled()
            else None
        )
        try:
            if resumed and request.sampling.n > 1:
                raise ChoicesLost()
            if early is None:
                self.engine.add(self._engine_request(entry.lane, request, waited, prior.resume_token_ids))
        except (AdapterNotFoundError, EngineError) as exc:  # bad input, or SLOUnattainableError
            refusal: Exception = exc
            if isinstance(exc, AdapterNotFoundError):  # deleted while it waited: as if it never existed
                assert request.lora is not None
                refusal = AdapterGone(
                    f"The model '{request.model}:{request.lora.name}' does not exist or you do not have "
                    "access to it.",
                    param="model",
                )
            if trace is not None:
                trace.refused(refusal)
            offset = 0 if isinstance(exc, ChoicesLost) else resumed  # choice 0's tokens (all of n = 1)
            self._outbox.append(error_result(self.worker_id, request.request_id, refusal, offset=offset))
            self._outbox_done.append((entry.lane, entry.entry_id))
            return 0
        with self.lock:
            self.inflight[request.request_id] = InFlight(
                entry.lane,
                entry.entry_id,
                offset=resumed,
                trace=trace,
                tenant=request.tenant,
                weight=request.weight,
                # not one a dead worker ran: its gateway counts tokens from both workers
                settlement=None if entry.claimed or resumed else entry.fields.get(SETTLEMENT),
                reply_to="" if early is None else early.reply_to,  # its first result starts its stream
            )
        return 1

    def _engine_request(
        self, lane: str, request: LaneRequest, waited: float, resume_token_ids: tuple[int, ...] = ()
    ) -> EngineRequest:
        return request.to_engine(
            priority=self.priorities[lane],
            arrival_time=time.monotonic() - waited,
            resume_token_ids=resume_token_ids,
            lora=self._lora(request),
        )

    def _lora(self, request: LaneRequest) -> LoRARequest | None:
        """The request's adapter as the engine takes it: its folder in the shared store."""
        if request.lora is None:
            return None
        return LoRARequest(
            name=f"{request.lora.id}:{request.lora.name}", path=str(self.adapters.path(request.lora.sha256))
        )
