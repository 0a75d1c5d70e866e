"""Scheduling policies on the real engine (SmolLM2, dtype auto, 2 threads) against FCFS, in one run,
in four scenarios scaled to what 2 CPU cores serve: fairness between two backlogged tenants of
weights 1 and 2 (VTC), a noisy neighbour (a light tenant's TTFT beside a heavy one, VTC), priority
tiers (interactive TTFT beside a batch backlog, submitted SETTLE_S before the first interactive
arrival: the steady state under saturation, not the absorption of the burst of requests, which over
HTTP is the gateway's admission rate, benchmarks.gateway_overhead) and 2x overload with latency
targets (goodput, SLO-aware admission).

    chrt -r 10 python -m benchmarks.scheduling        # about 5 minutes
    python -m benchmarks.scheduling --smoke           # a tiny random model, 0.5 s of arrivals
    python -m benchmarks.scheduling --http            # through `fairlane serve` (scheduling_http.py)

The traces come from the simulator (engine.sim) with shorter requests; arrivals follow the
wall clock and every step is a real forward. Writes scheduling.json (--http: scheduling_http.json)
and one PNG per scenario under --out (benchmarks/results), and prints a markdown table (copied into
the README). A driver runs each trace: `InProcess` (benchmarks/sched_inprocess.py), `HTTP`
(benchmarks/scheduling_http.py)
over HTTP, where a TTFT's split is what the client and the server's spans see.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import replace
from pathlib import Path

from benchmarks.common import add_common_args, done, machine, out_dir, tiny_model
from benchmarks.sched_service import max_gap
from engine.sim import backlog, bursty_trace, poisson_trace

SCENARIOS = ("fairness", "noisy_neighbour", "priority", "overload")
SMOKE_CAPACITY_RPS = 40.0  # --smoke: the scenarios' rates are scaled from at most this capacity
SETTLE_S = 2.0  # scenario 3: the batch backlog is submitted this long before interactive arrivals
SHAPE = dict(prompt_len=(32, 96), output_len=(16, 48))
ENGINE = {
    "model": "smollm2",
    "dtype": "auto",
    "num_threads": 2,
    "max_num_seqs": 32,
    "max_num_batched_tokens": 128,
    "kv_cache_gib": 0.5,
}


def capacity(d, n: int = 64) -> float:
    """Requests/s the engine serves from a backlog of n (FCFS)."""
    report = d.run("fcfs", backlog(n, random.Random(0), **SHAPE))
    return len(report.requests) / report.duration


def backlogged(report) -> float:
    """When both tenants had a request in the server's lane (seconds into the run); in process, in
    the engine (the later tenant's first arrival: 0 unless --fairness-jitter). Over HTTP the two
    clients' bursts reach the gateway in whatever order the machine runs them, and the first
    tenant's requests are served alone until the other's are in the lane; VTC's bound is on the
    service received while both are backlogged (a tenant that arrives late starts at the least
    counter, it banks nothing), so the gap is counted from then (from the spans; from the run's
    start without them, --no-spans)."""
    marks = getattr(report, "marks", None)
    first: dict[str, float] = {}
    for r in report.requests:
        if marks is None:  # in process: when it was added to the engine
            at = r.arrival
        else:
            at = marks.get(r.request_id, {}).get("enqueued")
            at = None if at is None else at - report.t0
        if at is not None:
            first[r.tenant] = min(first.get(r.tenant, at), at)
    return max(0.0, max(first.values())) if len(first) == 2 else 0.0


def fairness(d, n: int, jitter: float = 0.0, jitter_seed: int = 0) -> dict:
    """The largest weighted service gap while both tenants were backlogged, as VTC counts service
    (benchmarks/sched_service.py: prompt tokens as their chunks are computed), and the same with
    each prompt counted whole at its first token (``max_diff_at_first_token``)."""
    U = max(1.0 * SHAPE["prompt_len"][1], 2.0 * SHAPE["output_len"][1])
    out = {"bound": 2 * U}
    for policy in ("fcfs", "vtc"):
        rng = random.Random(0)
        a, b = (
            backlog(n, rng, tenant="A", weight=1.0, **SHAPE),
            backlog(n, rng, tenant="B", weight=2.0, **SHAPE),
        )
        trace = [r for pair in zip(a, b) for r in pair]
        if jitter:  # each arrival later by up to `jitter` s: the two bursts interleave by chance
            late = random.Random(jitter_seed)
            trace = [replace(r, arrival=r.arrival + late.uniform(0.0, jitter)) for r in trace]
        report = d.run(policy, trace)
        start = backlogged(report)
        end = min(last_admission(report, t) for t in "AB")
        seen_times, seen = report.seen_times, report.seen_service
        # 0 when one tenant's backlog was admitted before the other's was in the lane (a smoke
        # run's few requests on a loaded machine): no time when both were backlogged
        out[policy] = {
            "max_diff": max_gap(report.times, report.service["A"], report.service["B"], start, end),
            "max_diff_at_first_token": max_gap(seen_times, seen["A"], seen["B"], start, end),
            "backlogged_from_s": start,
            "backlogged_until_s": end,
            "times": report.times,
            "A": report.service["A"],
            "B": report.service["B"],
            **d.extra(report),
        }
    return out


def last_admission(report, tenant: str) -> float:
    """When the tenant's last request was admitted (seconds into the run; its first token where the
    admission is not known): it is no longer backlogged after that."""
    admitted = getattr(report, "admitted", {})
    return max(
        (
            admitted.get(r.request_id, r.first_token)
            for r in report.select(tenant=tenant)
            if r.first_token is not None
        ),
        default=0.0,
    )


def noisy_neighbour(d, cap: float, duration: float) -> dict:
    a = poisson_trace(2 * cap, duration, random.Random(1), tenant="A", **SHAPE)
    b = poisson_trace(0.2 * cap, duration, random.Random(2), tenant="B", **SHAPE)
    solo = d.run("fcfs", b)
    out = {"b_solo_p99": solo.ttft_p(99, tenant="B"), "b_solo_p50": solo.ttft_p(50, tenant="B")}
    out["b_solo_waits"] = d.waits(solo, solo.requests)
    for policy in ("fcfs", "vtc"):
        report = d.run(policy, a + b, until=duration)
        out[policy] = {
            "b_waits": d.waits(report, report.select(tenant="B")),
            "b_p99": report.ttft_p(99, tenant="B"),
            "b_p50": report.ttft_p(50, tenant="B"),
            "a_p99": report.ttft_p(99, tenant="A"),
            "a_p50": report.ttft_p(50, tenant="A"),
            "b_started": len(report.ttfts(tenant="B")),
            "b_sent": len(b),
            **d.extra(report),
        }
    return out


def priority(d, cap: float, duration: float) -> dict:
    inter = poisson_trace(0.2 * cap, duration, random.Random(3), tenant="interactive", priority=1, **SHAPE)
    batch = backlog(int(1.5 * cap * duration), random.Random(4), tenant="batch", priority=0, **SHAPE)
    solo = d.run("priority", inter)
    settle = min(SETTLE_S, duration)  # (--smoke: its short duration)
    # the batch tier alone over the window it gets beside the interactive tier (its backlog arrives
    # at 0 in both): tokens of finished requests come in waves of up to max_num_seqs, so two
    # windows of different lengths can differ by a whole wave
    window = duration + settle
    out = {
        "inter_solo_p99": solo.ttft_p(99, priority=1),
        "inter_solo_p50": solo.ttft_p(50, priority=1),
        "inter_solo_waits": d.waits(solo, solo.requests),
        "batch_solo_tps": d.run("priority", batch, until=window).throughput(until=window, priority=0),
    }
    late = [replace(r, arrival=r.arrival + settle) for r in inter]  # once the backlog is in
    out["settle_s"] = settle
    for policy in ("fcfs", "priority"):
        report = d.run(policy, late + batch, until=window)
        out[policy] = {
            "inter_waits": d.waits(report, report.select(priority=1)),
            "inter_p99": report.ttft_p(99, priority=1),
            "inter_p50": report.ttft_p(50, priority=1),
            "batch_p50": report.ttft_p(50, priority=0),
            "batch_tps": report.throughput(until=window, priority=0),
            "batch_finished": len(report.finished(priority=0)),
            "preemptions": report.preemptions,
            **d.extra(report),
        }
    return out


def overload(d, cap: float, duration: float, ttft: float, tpot: float) -> dict:
    trace = bursty_trace(
        2 * cap, duration, random.Random(5), burst=4, ttft_target_s=ttft, tpot_target_s=tpot, **SHAPE
    )
    out = {"ttft_target_s": ttft, "tpot_target_s": tpot, "sent": len(trace)}
    for policy in ("fcfs", "slo"):
        report = d.run(policy, trace, until=2 * duration)
        out[policy] = {
            "goodput_rps": sum(r.met_slo() for r in report.requests) / duration,
            "refused": sum(r.refused for r in report.requests),
            "ttft_p99": report.ttft_p(99),
            "ttft_p50": report.ttft_p(50),
            **d.extra(report),
        }
    return out


def _s(x: float) -> str:
    return "none started" if x != x else f"{x:.2f} s"  # NaN: no request of the group got a token


def _div(a: float, b: float) -> float:
    return a / b if b else float("nan")  # a solo run with nothing finished or started


def table(res: dict, d) -> str:
    f, n, p, o = res["fairness"], res["noisy_neighbour"], res["priority"], res["overload"]
    rows = [
        "| scenario | measure | FCFS | policy | target |",
        "| --- | --- | --- | --- | --- |",
        f"| 1 fairness, weights 1:2 | max weighted service gap (prompts whole at first token) | "
        f"{f['fcfs']['max_diff']:.0f} ({f['fcfs']['max_diff_at_first_token']:.0f}) | "
        f"{f['vtc']['max_diff']:.0f} ({f['vtc']['max_diff_at_first_token']:.0f}) (VTC) | "
        f"<= 2U = {f['bound']:.0f} |",
        f"| 2 noisy neighbour | B p99 TTFT (solo {n['b_solo_p99']:.2f} s) | {_s(n['fcfs']['b_p99'])} | "
        f"{n['vtc']['b_p99']:.2f} s (VTC, {_div(n['vtc']['b_p99'], n['b_solo_p99']):.2f}x solo) | "
        "<= 1.5x solo |",
        f"| 3 priority | interactive p99 TTFT (solo {p['inter_solo_p99']:.2f} s) | "
        f"{_s(p['fcfs']['inter_p99'])} | "
        f"{p['priority']['inter_p99']:.2f} s "
        f"({_div(p['priority']['inter_p99'], p['inter_solo_p99']):.2f}x) | "
        "<= 1.5x solo |",
        f"| 3 priority | batch tokens/s vs solo ({p['batch_solo_tps']:.0f}) | {p['fcfs']['batch_tps']:.0f} | "
        f"{p['priority']['batch_tps']:.0f} "
        f"({_div(p['priority']['batch_tps'], p['batch_solo_tps']):.0%}) | >= "
        "70% |",
        f"| 4 overload 2x, TTFT {o['ttft_target_s']} s / TPOT {o['tpot_target_s']} s | goodput (req/s) | "
        f"{o['fcfs']['goodput_rps']:.2f} | {o['slo']['goodput_rps']:.2f} (SLO-aware, {o['slo']['refused']} "
        "of "
        f"{o['sent']} refused) | >= 1.5x FCFS |",
    ]
    rows += [
        "",
        "First-token waits (ms; mean over the group, then the slowest request's TTFT and split):",
        "",
        *d.waits_header,
        d.line("2 light tenant B alone", n["b_solo_waits"]),
        *(d.line(f"2 light tenant B, {k}", n[k]["b_waits"]) for k in ("fcfs", "vtc")),
        d.line("3 interactive alone", p["inter_solo_waits"]),
        *(d.line(f"3 interactive, {k}", p[k]["inter_waits"]) for k in ("fcfs", "priority")),
    ]
    return "\n".join(rows)


def plot(res: dict, out: Path, d) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    f = res["fairness"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, policy in zip(axes, ("fcfs", "vtc")):
        ax.plot(f[policy]["times"], f[policy]["A"], label="A (weight 1)")
        ax.plot(f[policy]["times"], f[policy]["B"], label="B (weight 2)")
        ax.set_title(f"{policy}: weighted service, {d.where}")
        ax.set_xlabel("s")
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / f"{d.name}_fairness.png", dpi=100)
    bars = {
        "noisy_neighbour": (
            "B p99 TTFT (s)",
            ["solo", "fcfs", "vtc"],
            [res["noisy_neighbour"]["b_solo_p99"]]
            + [res["noisy_neighbour"][k]["b_p99"] for k in ("fcfs", "vtc")],
        ),
        "priority": (
            "interactive p99 TTFT (s)",
            ["solo", "fcfs", "priority"],
            [res["priority"]["inter_solo_p99"]]
            + [res["priority"][k]["inter_p99"] for k in ("fcfs", "priority")],
        ),
        "overload": (
            "goodput (req/s)",
            ["fcfs", "slo"],
            [res["overload"][k]["goodput_rps"] for k in ("fcfs", "slo")],
        ),
    }
    for name, (label, keys, values) in bars.items():
        fig, ax = plt.subplots(figsize=(5, 4))
        ax.bar(keys, values, color=["#999", "#69c", "#e63"][: len(keys)])
        ax.set_ylabel(label)
        ax.set_title(name.replace("_", " ") + f" ({d.where})")
        fig.tight_layout()
        fig.savefig(out / f"{d.name}_{name}.png", dpi=100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of arrivals per scenario")
    ap.add_argument(
        "--only", nargs="*", choices=SCENARIOS, help="run these scenarios only (prints, writes nothing)"
    )
    ap.add_argument(
        "--capacity", type=float, help="requests/s (default: measured first, FCFS from a backlog)"
    )
    ap.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="engine/scheduler settings for every run, e.g. urgent_prefill_defers_decodes=true",
    )
    ap.add_argument(
        "--http",
        action="store_true",
        help="the same scenarios through `fairlane serve` over HTTP (benchmarks/scheduling_http.py)",
    )
    ap.add_argument(
        "--fairness-jitter",
        type=float,
        default=0.0,
        metavar="S",
        help="scenario 1: each arrival later by up to S seconds (seeded by --jitter-seed)",
    )
    ap.add_argument("--jitter-seed", type=int, default=0)
    ap.add_argument("--no-spans", action="store_true", help="--http: no spans in the server's log (no split)")
    ap.add_argument("--keep-logs", action="store_true", help="--http: keep the servers' logs")
    ap.add_argument(
        "--no-interrupt",
        action="store_true",
        help="in process: requests arrive between steps only (no urgent step inside a step in flight)",
    )
    add_common_args(ap)
    args = ap.parse_args()
    for item in args.set:
        key, _, value = item.partition("=")
        try:
            ENGINE[key] = json.loads(value)
        except json.JSONDecodeError:
            ENGINE[key] = value
    if args.http and not any(item.startswith("num_threads=") for item in args.set):
        # the engine threads `fairlane serve` gives its worker on this host (gateway/cli/threads.py:
        # the cores less one), not the in-process runs' every core: the gateway, Redis and the
        # clients share the machine with the engine here
        from gateway.cli.threads import engine_threads, usable_cpus

        ENGINE["num_threads"] = engine_threads(1, usable_cpus())
    backlog_n, capacity_n = 24, 64
    if args.smoke:
        ENGINE.update(model=tiny_model(), dtype="float32", num_threads=1, kv_cache_gib=0.02)
        args.duration, backlog_n, capacity_n = 0.5, 4, 8
    if args.http:
        from benchmarks.scheduling_http import HTTP

        with HTTP(ENGINE, spans=not args.no_spans, keep_logs=args.keep_logs, smoke=args.smoke) as d:
            measure(args, d, backlog_n, capacity_n)
    else:
        # imported here: --http's client processes (spawned) import this module again, and the
        # engine (torch) would cost each of them seconds of CPU on the server's cores
        from benchmarks.sched_inprocess import InProcess

        measure(args, InProcess(ENGINE, interrupt=not args.no_interrupt), backlog_n, capacity_n)


def measure(args: argparse.Namespace, d, backlog_n: int, capacity_n: int) -> None:
    """Every scenario (or --only's) through the driver `d`; results written unless --only."""
    cap = args.capacity or capacity(d, capacity_n)
    print(f"capacity: {cap:.2f} requests/s", flush=True)
    if args.smoke:  # the tiny model serves ~100 requests/s: traces at that rate only take longer
        cap = min(cap, SMOKE_CAPACITY_RPS)
    res = {
        "capacity_rps": cap,
        "shape": SHAPE,
        "engine": ENGINE,
        "duration_s": args.duration,
        "smoke": args.smoke,
        "machine": machine(),
        **d.extra(None),
    }
    runs = {
        "fairness": lambda: fairness(d, backlog_n, args.fairness_jitter, args.jitter_seed),
        "noisy_neighbour": lambda: noisy_neighbour(d, cap, args.duration),
        "priority": lambda: priority(d, cap, args.duration),
        "overload": lambda: overload(d, cap, args.duration, ttft=2.0, tpot=0.3),
    }
    for name in args.only or SCENARIOS:
        res[name] = runs[name]()
        print(
            name,
            "done:",
            {k: v for k, v in res[name].items() if not isinstance(v, (list, dict))},
            {
                k: {kk: vv for kk, vv in v.items() if not isinstance(vv, list)}
                for k, v in res[name].items()
                if isinstance(v, dict)
            },
            flush=True,
        )
    if args.only:
        return
    out = out_dir(args, d.name)
    (out / f"{d.name}.json").write_text(json.dumps(res, indent=1, default=float))
    plot(res, out, d)
    print(table(res, d))
    done(out)


if __name__ == "__main__":
    main()
