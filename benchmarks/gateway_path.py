"""The gateway's request path in process, stage by stage, against a null engine (for
benchmarks.gateway_overhead): the route's steps in the order of ``gateway.generation.start``,
each timed, with the gateway's own objects; an open and a closed loop of such requests."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import statistics
import time
import uuid

import tenancy
from benchmarks.gateway_probes import LoopWatch, RoundTrips
from engine import SamplingParams
from gateway.api.auth import AuthContext
from gateway.api.outcome import RequestOutcome, Status
from gateway.api.request_telemetry import request_attributes
from gateway.api.state import GatewayState
from gateway.lanes.keys import lane_key, model_info_key, out_key, workers_key
from gateway.lanes.messages import LaneRequest, LaneResult
from gateway.settings import ApiSettings
from gateway.telemetry import gc_policy, tracing

TIER = "standard"
PROMPT = tuple(range(1, 33))  # 32 prompt tokens
MAX_TOKENS = 16
MAX_MODEL_LEN = 2048
STAGES = ("auth", "checks", "quotas", "enqueue")
SEGMENTS = 4  # with tracing: off and on alternate this many times each
P99_TARGET_MS = 5.0  # the gateway path's p99 target: --crossing looks for the rate that passes it


def null_engine(redis_url: str, model: str, ready, stop) -> None:
    """A worker that echoes every lane entry's first MAX_TOKENS prompt tokens back, finished."""
    import redis

    r = redis.Redis.from_url(redis_url)
    lane, last, beat = lane_key(model, TIER), "$", time.time()
    r.hset(model_info_key(model), "max_model_len", MAX_MODEL_LEN)
    r.zadd(workers_key(model), {"null": beat})
    ready.set()
    while not stop.is_set():
        if time.time() - beat > 0.5:  # heartbeat, as gateway/worker_main.py
            beat = time.time()
            r.zadd(workers_key(model), {"null": beat})
        reply = r.xread({lane: last}, block=100, count=256)
        if not reply:
            continue
        pipe = r.pipeline(transaction=False)
        for entry_id, fields in reply[0][1]:
            last = entry_id
            req = LaneRequest.decode(fields)
            out = req.prompt_token_ids[: req.sampling.max_tokens]
            result = LaneResult(
                request_id=req.request_id,
                token_ids=out,
                done=True,
                finish_reason="length",
                num_prompt_tokens=len(req.prompt_token_ids),
                num_output_tokens=len(out),
                worker="null",
            )
            pipe.xadd(out_key(req.request_id), result.encode())
            pipe.expire(out_key(req.request_id), 60)
            pipe.xdel(lane, entry_id)
        pipe.execute()
    r.delete(workers_key(model), model_info_key(model))


def _otlp_sink(port, spans, stop) -> None:
    """The receiver's process: an OTLP/HTTP server that decodes every export and counts its spans."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            request = ExportTraceServiceRequest.FromString(
                self.rfile.read(int(self.headers["content-length"]))
            )
            with spans.get_lock():
                spans.value += sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port.value = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stop.wait()
    server.shutdown()


class OTLPSink:
    """A local OTLP/HTTP trace receiver in a process of its own (as a collector is: its decoding
    does not compete with the gateway for the GIL); counts the spans it receives."""

    def __init__(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._port, self._spans, self._stop = ctx.Value("i", 0), ctx.Value("q", 0), ctx.Event()
        self._process = ctx.Process(
            target=_otlp_sink, args=(self._port, self._spans, self._stop), daemon=True
        )
        self._process.start()
        deadline = time.monotonic() + 30
        while not self._port.value and time.monotonic() < deadline:
            time.sleep(0.01)
        self.endpoint = f"http://127.0.0.1:{self._port.value}"

    @property
    def spans(self) -> int:
        return self._spans.value

    def close(self) -> None:
        self._stop.set()
        self._process.join(5)


class StagedPath:
    """The gateway's request path (``gateway.api.admit.start``), instrumented (seconds per stage)."""

    def __init__(self, state: GatewayState) -> None:
        self.state, self.quota = state, state.quota_service
        self.model = state.settings.model_name

    async def request(self, key: str) -> dict[str, float]:
        # With --trace, the gateway's spans of a request (the server span, auth, quota.admit inside
        # the quota service, the lane's traceparent); off, tracing.span is a null context.
        with tracing.span("POST /v1/chat/completions"):
            return await self._request(key)

    async def _request(self, key: str) -> dict[str, float]:
        state, rid = self.state, os.urandom(16).hex()  # the middleware's request id
        t0 = time.perf_counter()
        with tracing.span("auth"):
            auth: AuthContext | None = await state.key_cache.lookup(key)
        assert auth is not None
        t1 = time.perf_counter()
        assert await state.lanes.has_worker(self.model)
        assert len(PROMPT) < (await state.max_model_len() or MAX_MODEL_LEN)
        t2 = time.perf_counter()
        tracing.set_attributes(
            request_attributes(auth=auth, tier=TIER, model=self.model, max_tokens=MAX_TOKENS)
        )
        lane_request = LaneRequest(
            request_id=rid,
            model=self.model,
            tier=TIER,
            tenant=str(auth.tenant_id),
            prompt_token_ids=PROMPT,
            sampling=SamplingParams(max_tokens=MAX_TOKENS),
            weight=auth.weight,
            traceparent=tracing.inject() if tracing.enabled() else None,
        )
        admission = await self.quota.admit(
            auth=auth,
            request_id=rid,
            tier=TIER,
            prompt_tokens=len(PROMPT),
            max_tokens=MAX_TOKENS,
            lane_entry=state.lanes.entry(lane_request),
        )
        t3 = time.perf_counter()
        if not admission.queued:
            await state.lanes.submit(lane_request)
        t4 = time.perf_counter()
        completion = 0
        async for result in state.lanes.results(rid, timeout_s=10):
            completion += len(result.token_ids)
        t5 = time.perf_counter()
        outcome = RequestOutcome(
            Status.FINISHED, prompt_tokens=len(PROMPT), completion_tokens=completion, finish_reason="length"
        )
        await self.quota.settle(admission, outcome)
        t6 = time.perf_counter()
        await state.lanes.discard(rid)
        return {
            "auth": t1 - t0,
            "checks": t2 - t1,
            "quotas": t3 - t2,
            "enqueue": t4 - t3,
            "overhead": t4 - t0,
            "end_to_end": t5 - t0,
            "settle": t6 - t5,
        }


def make_tenant(db_url: str) -> tuple[str, object]:
    """A tenant with one API key and generous quotas in a fresh database; (key, sessions)."""
    tenancy.upgrade(db_url)
    sessions = tenancy.make_session_factory(tenancy.make_engine(db_url))
    with sessions() as s:
        tenant = tenancy.create_tenant(s, name="bench", default_tier=TIER, allowed_tiers=[TIER])
        key = tenancy.create_api_key(s, tenant_id=tenant.id).key
        tenancy.set_quota(
            s,
            tenant_id=tenant.id,
            requests_per_minute=10_000_000,
            tokens_per_minute=100_000_000,
            max_concurrency=100_000,
            daily_token_budget=10**12,
            monthly_token_budget=10**13,
        )
    return key, sessions


def pct(values: list[float], q: float) -> float:
    """The q-quantile in milliseconds."""
    return statistics.quantiles(values, n=1000, method="inclusive")[round(q * 1000) - 1] * 1000


async def open_loop(
    path: StagedPath, key: str, rate: float, seconds: float, errors: list[str] | None = None
) -> dict[str, list[float]]:
    """Start one request every 1/rate s regardless of completions; stage samples in s."""
    n, start = int(rate * seconds), time.perf_counter()
    tasks = []
    for i in range(n):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(path.request(key)))
    samples = await asyncio.gather(*tasks, return_exceptions=errors is not None)
    if errors is not None:  # a request that failed (past the machine's capacity): named, not timed
        errors.extend(f"{type(s).__name__}: {s}"[:200] for s in samples if isinstance(s, BaseException))
        samples = [s for s in samples if not isinstance(s, BaseException)]
    return {name: [s[name] for s in samples] for name in samples[0]} if samples else {}


async def closed_loop(path: StagedPath, key: str, concurrency: int, seconds: float) -> float:
    """Admitted (and completed) requests per second with `concurrency` callers."""
    done, deadline = 0, time.perf_counter() + seconds

    async def caller():
        nonlocal done
        while time.perf_counter() < deadline:
            await path.request(key)
            done += 1

    start = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    return done / (time.perf_counter() - start)


async def crossing(path: StagedPath, key: str, low: float, high: float, probes: int, seconds: float) -> dict:
    """The highest open-loop rate in [low, high] whose overhead p99 stays within P99_TARGET_MS, by
    bisection on a log scale (``high`` did not pass it; ``low`` did, or is taken to: a ``rate_rps``
    equal to ``low`` means no probe passed); each probe an open loop of ``seconds``; the answer
    lies between ``rate_rps`` and ``failed_at_rps``."""
    tried: dict[str, dict] = {}
    for _ in range(probes):
        rate = (low * high) ** 0.5
        samples = await open_loop(path, key, rate, seconds, failed := [])
        p99 = pct(samples["overhead"], 0.99) if samples else float("inf")
        ok = p99 <= P99_TARGET_MS and not failed
        tried[f"{rate:.0f}"] = {"overhead_p99_ms": p99, "passed": ok, "failed": len(failed)}
        low, high = (rate, high) if ok else (low, rate)
    return {"rate_rps": low, "failed_at_rps": high, "probes": tried, "seconds": seconds}


def _rate_run(
    samples: dict[str, list[float]], trips: RoundTrips, watch: LoopWatch, failed: list[str] = ()
) -> dict:
    """One open loop's stage percentiles, Redis round trips per request, loop lag and GC pauses."""
    n = len(samples["overhead"])
    return {
        "requests": n,
        "stages": {
            name: {"p50_ms": pct(v, 0.50), "p99_ms": pct(v, 0.99)}
            for name, v in samples.items()
            if name != "enqueue" or max(v) > 0
        },
        "redis_round_trips_per_request": trips.count / (n + len(failed)),
        **watch.summary(),
        "failed": len(failed),
        "failures": sorted(set(failed))[:5],
    }


async def stages(args, redis_url: str, db_url: str) -> dict:
    """The gateway's path in process, stage by stage, against a null engine."""
    key, _sessions = make_tenant(db_url)
    model = f"bench-null-{uuid.uuid4().hex[:8]}"
    ctx = multiprocessing.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    echo = ctx.Process(target=null_engine, args=(redis_url, model, ready, stop), daemon=True)
    echo.start()
    assert ready.wait(60), "null engine did not start"
    # The gateway's own parts, as a replica opens them ("dummy": no weights, prompts are ids).
    settings = ApiSettings(
        dev=True,
        engine={"model": "dummy"},
        served_model_name=model,
        redis_url=redis_url,
        database_url=db_url,
        quota_key_prefix=f"bench:{model}",
    )
    state = GatewayState.open(settings)
    thresholds = gc_policy.freeze()  # as a replica's lifespan does once it has started
    state.quota_service.queues_lanes = not args.separate_enqueue  # separate: as with a quota Redis of its own
    receiver = None
    if args.trace:  # spans exported over OTLP/HTTP to a local receiver that decodes them (a collector's cost)
        receiver = OTLPSink()
        tracing.setup_tracing(
            settings.model_copy(update={"otel_endpoint": receiver.endpoint}), "bench-gateway"
        )
    path = StagedPath(state)
    samples_off: dict[str, list[float]] = {}
    at_rate: dict[float, dict] = {}
    crossed = None
    try:
        await open_loop(path, key, args.rate, min(1.0, args.seconds))  # warm-up: caches, scripts, connections
        if receiver is None:
            with RoundTrips() as trips:
                async with LoopWatch() as watch:
                    samples = await open_loop(path, key, args.rate, args.seconds)
            at_rate = {args.rate: _rate_run(samples, trips, watch)}
            if args.high_rate:  # where the tail goes past the target rate
                with RoundTrips() as trips:
                    async with LoopWatch() as watch:
                        high = await open_loop(path, key, args.high_rate, args.seconds, failed := [])
                at_rate[args.high_rate] = _rate_run(high, trips, watch, failed)
            p99_low, p99_high = (
                at_rate[r]["stages"]["overhead"]["p99_ms"] for r in (args.rate, args.high_rate or args.rate)
            )
            half = args.seconds / 2
            if args.crossing and args.high_rate and p99_low <= P99_TARGET_MS < p99_high:
                crossed = await crossing(path, key, args.rate, args.high_rate, args.crossing, half)
            elif args.crossing and p99_low > P99_TARGET_MS:  # below --rate: from an eighth of it up
                crossed = await crossing(path, key, args.rate / 8, args.rate, args.crossing, half)
        else:  # tracing off and on in alternating segments of one run: the machine's drift hits both alike
            provider, samples = tracing._provider, {}
            for _ in range(SEGMENTS):
                for on, into in ((False, samples_off), (True, samples)):
                    tracing.use_provider(provider if on else None)
                    for name, values in (
                        await open_loop(path, key, args.rate, args.seconds / SEGMENTS)
                    ).items():
                        into.setdefault(name, []).extend(values)
            tracing.use_provider(provider)
        throughput = await closed_loop(path, key, args.concurrency, args.seconds)
    finally:
        if receiver is not None:
            tracing.shutdown_tracing()
            receiver.close()
        stop.set()
        echo.join(5)
        await state.redis.delete(lane_key(model, TIER))
        await state.close()
        gc_policy.thaw(thresholds)

    def summary(of: dict[str, list[float]]) -> dict:
        return {
            name: {"p50_ms": pct(v, 0.50), "p99_ms": pct(v, 0.99), "mean_ms": 1000 * statistics.fmean(v)}
            for name, v in of.items()
        }

    stats = summary(samples)
    extra = {}
    if samples_off:
        off = summary(samples_off)
        extra = {
            "stages_tracing_off": off,
            "segments": SEGMENTS,
            "tracing_cost_ms": {q: stats["overhead"][q] - off["overhead"][q] for q in ("p50_ms", "p99_ms")},
            "samples_off_ms": {n: [1000 * x for x in samples_off[n]] for n in (*STAGES, "overhead")},
        }
    return {
        **extra,
        "rate_rps": args.rate,
        "open_loop": {f"{rate:g}": run for rate, run in at_rate.items()},
        "p99_crossing": crossed,  # None: not searched (both rates on the same side of the target)
        "seconds": args.seconds,
        "requests": len(samples["overhead"]),
        "tracing": f"on, {receiver.spans} spans exported" if receiver is not None else "off",
        "enqueue": "separate XADD" if args.separate_enqueue else "in the admission call",
        "stages": stats,
        "closed_loop": {"concurrency": args.concurrency, "admitted_rps": throughput},
        "target": {"p50_ms": 1.0, "p99_ms": 5.0},
        "samples_ms": {n: [1000 * x for x in samples[n]] for n in (*STAGES, "overhead")},
    }
