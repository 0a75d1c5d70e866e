"""Where a served request's time goes: timestamps along the path of one chat at a time.

    python -m benchmarks.path_timeline              # 1,000 requests, about a minute on 2 CPU cores
    python -m benchmarks.path_timeline --smoke      # a few requests (20, after 10 to warm up)

``fairlane serve`` runs as in benchmarks.gateway_overhead (a tiny random-weight Llama with SmolLM2's
tokenizer, one engine thread, fp32, the embedded Redis-compatible server) with
``FAIRLANE_PATH_MARKS`` naming a file: the gateway and its worker append a timestamp at each mark
of gateway/telemetry/path_marks.py, on the host's one monotonic clock. The lean keep-alive client
of benchmarks.round_trip sends ``--requests`` ``max_tokens=1`` chats at concurrency 1 and notes
each one's send and end; the marks between them are that request's. The table gives each mark's
time from the send (p50 / p90 over the requests that passed every mark) and the stages between
them; an early-started request's step begins before its admission is back, so the stages overlap
and do not add up to the round trip. A request whose worker was not idle when its hint came (or a
server with ``early_start: false``) passes no early-step marks and is left out; the count of those
kept is printed.

Writes path_timeline.json and path_timeline.png under --out (benchmarks/results).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
from pathlib import Path

from benchmarks.common import add_common_args, done, machine, out_dir, tiny_model
from benchmarks.gateway_path import pct
from benchmarks.round_trip import lean_closed_loop, serve
from gateway.telemetry import path_marks

CHAT = [{"role": "user", "content": "Say hello in French."}]
ENGINE = {"num_threads": 1, "dtype": "float32", "num_kv_blocks": 1024}
WARMUP = 50
# (stage, from mark, to mark), in a request's order; "send" and "end" are the client's
STAGES = [
    ("client to the route", "send", "route_in"),
    ("key, body and checks", "route_in", "tokenized_in"),
    ("tokenization", "tokenized_in", "tokenized_out"),
    ("plan and lane entry", "tokenized_out", "hinted"),
    ("hint to the worker", "hinted", "worker_hint"),
    ("worker to its step", "worker_hint", "early_step_in"),
    ("engine step", "early_step_in", "early_step_out"),
    ("admission (gateway, beside the step)", "hinted", "admitted"),
    ("step end to the entry read", "early_step_out", "worker_entry"),
    ("entry read to the publish", "worker_entry", "publish_in"),
    ("publish to the gateway's reader (echo or Redis)", "publish_in", "results_in"),
    ("publish's round trip (worker)", "publish_in", "publish_out"),
    ("reader to the request", "results_in", "first_results"),
    ("relay and response", "first_results", "route_out"),
    ("route to the client's end", "route_out", "end"),
]
MARKS = ["send", *dict.fromkeys(m for _, a, b in STAGES for m in (a, b) if m not in ("send", "end")), "end"]


def requests_marks(times_ns: list[tuple[int, int]], marks: list[tuple[str, int]]) -> list[dict[str, int]]:
    """Each request's marks: the first of each name between its send and its end."""
    out, i = [], 0
    for send, end in times_ns:
        while i < len(marks) and marks[i][1] < send:
            i += 1
        seen = {"send": send, "end": end}
        while i < len(marks) and marks[i][1] <= end:
            seen.setdefault(marks[i][0], marks[i][1])
            i += 1
        out.append(seen)
    return out


def quantiles_ms(values_ns: list[int]) -> dict[str, float]:
    seconds = [v / 1e9 for v in values_ns]
    mean_ms = 1000 * statistics.fmean(seconds)
    return {"p50_ms": pct(seconds, 0.5), "p90_ms": pct(seconds, 0.9), "mean_ms": mean_ms}


def measure(requests: int, warmup: int = WARMUP) -> dict:
    model = tiny_model()
    env = {f"FAIRLANE_ENGINE__{k.upper()}": str(v) for k, v in ENGINE.items()}
    with tempfile.TemporaryDirectory() as tmp:
        marks_file = Path(tmp) / "marks.txt"
        served = serve(model, Path(tmp), env={**env, path_marks.ENV: str(marks_file)})
        body = {"model": Path(model).name, "messages": CHAT, "max_tokens": 1}
        times_ns: list[tuple[int, int]] = []
        try:
            asyncio.run(lean_closed_loop(served, body, requests=warmup, concurrency=1))
            asyncio.run(lean_closed_loop(served, body, requests=requests, concurrency=1, times_ns=times_ns))
        finally:
            served.stop()
        per_request = requests_marks(times_ns, path_marks.read(marks_file))
    complete = [r for r in per_request if all(m in r for m in MARKS)]
    if not complete:
        raise RuntimeError(f"no request passed every mark ({MARKS}); got {sorted(per_request[-1])}")
    return {
        "requests": requests,
        "complete": len(complete),
        "round_trip": quantiles_ms([r["end"] - r["send"] for r in per_request]),
        "marks_from_send": {m: quantiles_ms([r[m] - r["send"] for r in complete]) for m in MARKS[1:]},
        "stages": {name: quantiles_ms([r[b] - r[a] for r in complete]) for name, a, b in STAGES},
    }


def table(result: dict) -> str:
    trip = result["round_trip"]
    rows = [
        f"round trip p50 / p90: {trip['p50_ms']:.2f} / {trip['p90_ms']:.2f} ms "
        f"({result['complete']} of {result['requests']} requests passed every mark)",
        "",
        "| stage | p50 (ms) | p90 (ms) | ends at, from the send: p50 (ms) |",
        "| --- | --- | --- | --- |",
    ]
    for name, _, to in STAGES:
        s, at = result["stages"][name], result["marks_from_send"][to]
        rows.append(f"| {name} | {s['p50_ms']:.3f} | {s['p90_ms']:.3f} | {at['p50_ms']:.3f} |")
    return "\n".join(rows)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5))
    names = [name for name, _, _ in STAGES]
    for row, (name, start, _) in enumerate(STAGES):
        begin = 0.0 if start == "send" else result["marks_from_send"][start]["p50_ms"]
        width = result["stages"][name]["p50_ms"]
        ax.barh(row, width, left=begin, color="#69c" if "worker" in name or "step" in name else "#e63")
        ax.text(begin + width, row, f" {width:.2f}", va="center", fontsize=7)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.invert_yaxis()
    ax.set(
        xlabel="ms from the client's send (p50 of each mark, p50 of each stage)",
        title=f"one max_tokens=1 chat at concurrency 1 through fairlane serve "
        f"(round trip p50 {result['round_trip']['p50_ms']:.2f} ms)",
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=1000, help="timed requests at concurrency 1")
    add_common_args(parser)
    args = parser.parse_args()
    warmup = WARMUP
    if args.smoke:
        args.requests, warmup = 20, 10
    out = out_dir(args, "path_timeline")
    result = {**measure(args.requests, warmup), "smoke": args.smoke, "engine": ENGINE, "machine": machine()}
    (out / "path_timeline.json").write_text(json.dumps(result, indent=1))
    plot(result, out / "path_timeline.png")
    print(table(result))
    done(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
