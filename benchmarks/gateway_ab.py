"""Two versions of the serving path side by side in one run: the round trip a client sees, the CPU
each process spends per request and the Redis commands per request.

    git archive <commit> | tar -x -C /tmp/base        # the version to compare against
    python -m benchmarks.gateway_ab --baseline /tmp/base
    python -m benchmarks.gateway_ab --smoke       # this tree against itself, a few requests
                                                  # (both servers start at once, a short warm-up)

``fairlane serve`` (embedded Redis-compatible server, SQLite, one worker, the tiny model of
benchmarks.gateway_overhead) runs from the baseline tree and from this one at the same time, and
each of ``--rounds`` rounds sends both their loops in turn (the first alternating: a machine whose
load drifts hits both alike). Each serves one chat request with ``max_tokens=1`` in closed loops at
concurrency 1 and ``--concurrency``, sent by the lean
client of benchmarks.round_trip (it costs the shared cores almost nothing), and the same requests
run in process on an engine are the floor. Per request it reports, beside the latencies, the CPU
time of the gateway, the worker and Redis (from /proc, Linux) and the Redis commands executed
(``INFO commandstats``).

Writes gateway_ab.json and gateway_ab.png under --out (benchmarks/results) and prints a table with
the ratios this / baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path

from benchmarks.common import add_common_args, done, machine, out_dir, tiny_model
from benchmarks.round_trip import REPO, Served, engine_closed_loop, lean_closed_loop, serve, start_at_once

CHAT = [{"role": "user", "content": "Say hello in French."}]
ENGINE = {"num_threads": 1, "dtype": "float32", "num_kv_blocks": 1024}
TICK_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK_S


def processes(served: Served) -> dict[str, int]:
    """The pids of serve's gateway, its worker and its embedded Redis."""
    found = {"gateway": served.process.pid}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) != served.process.pid:  # a child of serve
            continue
        if "gateway.worker" in cmdline:
            found["worker"] = int(entry.name)
        elif "valkey" in cmdline or "redis" in cmdline:
            found["redis"] = int(entry.name)
    return found


def redis_calls(url: str) -> int:
    import redis

    client = redis.Redis.from_url(url)
    try:
        return sum(v["calls"] for k, v in client.info("commandstats").items() if k != "cmdstat_info")
    finally:
        client.close()


def measure(served: Served, body: dict, requests: int, concurrency: int) -> dict:
    """One closed loop: latencies (s), CPU seconds and Redis commands per request."""
    url = re.search(r"redis:\s+(\S+)", served.log_path.read_text()).group(1)
    pids = processes(served)
    cpu0, calls0 = {k: cpu_s(p) for k, p in pids.items()}, redis_calls(url)
    latencies = asyncio.run(lean_closed_loop(served, body, requests=requests, concurrency=concurrency))
    cpu1, calls1 = {k: cpu_s(p) for k, p in pids.items()}, redis_calls(url)
    return {
        "latencies": latencies,
        "cpu_ms": {k: 1000 * (cpu1[k] - cpu0[k]) / requests for k in pids},
        "redis_commands": (calls1 - calls0 - 1) / requests,  # less the second INFO's own
    }


def start(repo: Path, model: str, workdir: Path) -> Served:
    env = {f"FAIRLANE_ENGINE__{k.upper()}": str(v) for k, v in ENGINE.items()}
    return serve(model, workdir, env=env, repo=repo)


def loops(args) -> list[tuple[int, int]]:
    """(concurrency, requests) of each round's closed loops."""
    return [(1, args.requests), (args.concurrency, args.requests_c)]


def side_by_side(trees: dict[str, Path], args, model: str, workdir: Path) -> dict[str, list[dict]]:
    """Both versions served at once; every round runs each one's loops in turn, the first of them
    alternating, so that both see the same moments of a machine whose load drifts."""
    served: dict[str, Served] = {}
    body = {"model": Path(model).name, "messages": CHAT, "max_tokens": 1}
    runs: dict[str, list[dict]] = {side: [] for side in trees}
    try:
        for side in trees:
            (workdir / side).mkdir()
        if args.smoke:  # both start at once
            start_at_once(
                {side: partial(start, repo, model, workdir / side) for side, repo in trees.items()}, served
            )
        for side, repo in trees.items():
            if side not in served:
                served[side] = start(repo, model, workdir / side)
        for side in trees:  # warm-up: caches, scripts, connections (--smoke: a few requests)
            for concurrency, _n in loops(args):
                n = 2 * concurrency if args.smoke else max(20, 2 * concurrency)
                measure(served[side], body, n, concurrency)
        for i in range(args.rounds):
            order = list(trees) if i % 2 == 0 else list(reversed(trees))
            for side in order:
                runs[side].append({f"c{c}": measure(served[side], body, n, c) for c, n in loops(args)})
    finally:
        for one in served.values():
            one.stop()
    return runs


def in_process(args, model: str) -> dict[str, list[float]]:
    from engine import LLM, SamplingParams

    llm = LLM(model=model, incremental_text=True, **ENGINE)
    params, runs = SamplingParams(max_tokens=1), {}
    for concurrency, n in loops(args):
        n *= args.rounds
        engine_closed_loop(llm, CHAT, params, requests=2 * concurrency, concurrency=concurrency)
        runs[f"c{concurrency}"] = engine_closed_loop(llm, CHAT, params, requests=n, concurrency=concurrency)
    return runs


def pct(values: list[float], q: float) -> float:
    return 1000 * statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def summarize(runs: list[dict]) -> dict:
    """Rounds pooled: latency percentiles (ms), mean CPU ms and Redis commands per request."""
    out = {}
    for key in runs[0]:
        lat = [x for run in runs for x in run[key]["latencies"]]
        out[key] = {
            "p50_ms": pct(lat, 0.50),
            "p99_ms": pct(lat, 0.99),
            "requests": len(lat),
            "cpu_ms_per_request": {
                proc: statistics.fmean(run[key]["cpu_ms"].get(proc, 0.0) for run in runs)
                for proc in runs[0][key]["cpu_ms"]
            },
            "redis_commands_per_request": statistics.fmean(run[key]["redis_commands"] for run in runs),
        }
    return out


def table(result: dict) -> str:
    base, this, floor = result["baseline"], result["this"], result["in_process"]
    rows = [
        "| measure | baseline | this | this / baseline |",
        "| --- | --- | --- | --- |",
    ]
    for key in base:
        for name, get in (
            ("p50 ms", lambda s: s["p50_ms"]),
            ("p99 ms", lambda s: s["p99_ms"]),
            ("gateway CPU ms / request", lambda s: s["cpu_ms_per_request"]["gateway"]),
            ("worker CPU ms / request", lambda s: s["cpu_ms_per_request"].get("worker", 0.0)),
            ("Redis CPU ms / request", lambda s: s["cpu_ms_per_request"].get("redis", 0.0)),
            ("Redis commands / request (scripts' own included)", lambda s: s["redis_commands_per_request"]),
        ):
            a, b = get(base[key]), get(this[key])
            rows.append(f"| {key} {name} | {a:.2f} | {b:.2f} | {b / a if a else float('nan'):.2f} |")
        f = floor[key]
        rows.append(f"| {key} in process p50 / p99 ms | {f['p50_ms']:.2f} / {f['p99_ms']:.2f} | | |")
    return "\n".join(rows)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(result["baseline"])
    fig, axes = plt.subplots(1, len(keys), figsize=(6 * len(keys), 4.5))
    for ax, key in zip(axes, keys):
        for offset, (side, color) in enumerate(
            (("baseline", "#999"), ("this", "#e63"), ("in_process", "#69c"))
        ):
            s = result[side][key]
            bars = ax.bar(
                [offset * 0.27, 1 + offset * 0.27],
                [s["p50_ms"], s["p99_ms"]],
                width=0.27,
                color=color,
                label=side.replace("_", " "),
            )
            ax.bar_label(bars, fmt="%.1f", fontsize=8)
        ax.set_xticks([0.27, 1.27], ["p50", "p99"])
        ax.set(ylabel="ms", title=f"chat, max_tokens=1, concurrency {key[1:]}")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--baseline",
        type=Path,
        default=REPO,
        help="source tree of the version to compare (default: this one, an A/A run that shows the noise)",
    )
    parser.add_argument("--rounds", type=int, default=10, help="rounds; each runs both versions' loops")
    parser.add_argument("--requests", type=int, default=30, help="requests at concurrency 1, per round")
    parser.add_argument("--requests-c", type=int, default=96, help="requests at --concurrency, per round")
    parser.add_argument("--concurrency", type=int, default=32)
    add_common_args(parser)
    args = parser.parse_args()
    if args.smoke:
        args.rounds, args.requests, args.requests_c, args.concurrency = 1, 10, 16, 4
    out = out_dir(args, "gateway_ab")
    model, load_start = tiny_model(), os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"baseline": args.baseline.resolve(), "this": REPO}
        sides = side_by_side(trees, args, model, Path(tmp))
    floor = in_process(args, model)
    result = {
        "baseline_tree": str(args.baseline),
        "rounds": args.rounds,
        "concurrency": args.concurrency,
        "baseline": summarize(sides["baseline"]),
        "this": summarize(sides["this"]),
        "in_process": {k: {"p50_ms": pct(v, 0.5), "p99_ms": pct(v, 0.99)} for k, v in floor.items()},
        "machine": {
            **machine(),
            "load_average_1_5_15_start": load_start,
            "load_average_1_5_15_end": os.getloadavg(),
        },
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    plot(result, out / "gateway_ab.png")
    (out / "gateway_ab.json").write_text(json.dumps(result, indent=1))
    print(table(result))
    print(f"load average at start {load_start}, at end {result['machine']['load_average_1_5_15_end']}")
    done(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
