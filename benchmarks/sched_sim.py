"""Scheduling simulator: the real scheduler and block manager in virtual time, in four scenarios:
fairness between two backlogged tenants of weights 1 and 2 (FCFS against VTC), a noisy neighbour
(a light tenant's TTFT beside a heavy one), priority tiers (interactive TTFT beside a batch
backlog) and 2x overload with latency targets (goodput, FCFS against SLO-aware admission).

    python -m benchmarks.sched_sim            # a few seconds on one core
    python -m benchmarks.sched_sim --smoke    # shorter traces

Writes sched_sim.json and sched_sim_*.png under --out (benchmarks/results) and prints a markdown
table (docs/scheduling.md carries the latest one).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from benchmarks.common import add_common_args, done, out_dir  # noqa: E402
from engine.sim import scenarios  # noqa: E402


def _plain(d: dict) -> dict:
    return {
        k: (_plain(v) if isinstance(v, dict) else None if isinstance(v, float) and math.isnan(v) else v)
        for k, v in d.items()
        if k != "report"
    }


def plot_fairness(r: dict, out: Path) -> None:
    fig, ax = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for axis, policy in zip(ax, ("fcfs", "vtc")):
        rep = r[policy]["report"]
        axis.plot(rep.times, rep.service["A"], label="tenant A (weight 1)")
        axis.plot(rep.times, rep.service["B"], label="tenant B (weight 2)")
        axis.axvline(r[policy]["backlogged_until"], color="grey", ls=":", label="both backlogged until")
        axis.set_title(f"{policy}: max |S_A - S_B/2| = {r[policy]['max_diff']:.0f} (bound {r['bound']:.0f})")
        axis.set_xlabel("simulated seconds")
    ax[0].set_ylabel("weighted service / tenant weight")
    ax[0].legend()
    fig.tight_layout()
    fig.savefig(out / "sched_sim_fairness.png", dpi=100)
    plt.close(fig)


def plot_bars(out: Path, name: str, labels: list[str], values: list[float], ylabel: str) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar(labels, [0 if math.isnan(v) else v for v in values])
    ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    fig.tight_layout()
    fig.savefig(out / f"sched_sim_{name}.png", dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    args = parser.parse_args()
    out = out_dir(args, "sched_sim")
    if args.smoke:  # a fraction of the requests and seconds
        f, n = scenarios.fairness(n=20), scenarios.noisy_neighbour(duration=3.0)
        p, o = scenarios.priority(duration=3.0), scenarios.overload(duration=3.0)
    else:
        f, n, p, o = (
            scenarios.fairness(),
            scenarios.noisy_neighbour(),
            scenarios.priority(),
            scenarios.overload(),
        )
    plot_fairness(f, out)
    plot_bars(
        out,
        "noisy_ttft",
        ["B solo", "B with A, FCFS", "B with A, VTC"],
        [n["b_solo_p99"], n["fcfs"]["b_p99"], n["vtc"]["b_p99"]],
        "B p99 TTFT (s)",
    )
    plot_bars(
        out,
        "priority_ttft",
        ["interactive solo", "interactive, FCFS", "interactive, priority"],
        [p["inter_solo_p99"], p["fcfs"]["inter_p99"], p["priority"]["inter_p99"]],
        "interactive p99 TTFT (s)",
    )
    plot_bars(
        out,
        "goodput",
        ["FCFS", "SLO-aware"],
        [o["fcfs"]["goodput_rps"], o["slo"]["goodput_rps"]],
        "goodput (req/s)",
    )
    result = {
        "fairness": _plain(f),
        "noisy_neighbour": _plain(n),
        "priority": _plain(p),
        "overload": _plain(o),
    }
    (out / "sched_sim.json").write_text(json.dumps(result, indent=2))
    rows = [
        (
            "1 fairness, weights 1:2",
            "max weighted service gap",
            f"{f['fcfs']['max_diff']:.0f}",
            f"{f['vtc']['max_diff']:.0f} (VTC)",
            f"<= 2U = {f['bound']:.0f}",
        ),
        (
            "2 noisy neighbour",
            "B p99 TTFT (solo {:.3f} s)".format(n["b_solo_p99"]),
            f"{n['fcfs']['b_p99']:.3f} s",
            f"{n['vtc']['b_p99']:.3f} s (VTC, {n['vtc']['b_p99'] / n['b_solo_p99']:.2f}x solo)",
            "<= 1.5x solo",
        ),
        (
            "3 priority",
            "interactive p99 TTFT (solo {:.3f} s)".format(p["inter_solo_p99"]),
            "never started" if math.isnan(p["fcfs"]["inter_p99"]) else f"{p['fcfs']['inter_p99']:.3f} s",
            f"{p['priority']['inter_p99']:.3f} s (priority, "
            f"{p['priority']['inter_p99'] / p['inter_solo_p99']:.2f}x)",
            "<= 2x solo",
        ),
        (
            "3 priority",
            "batch throughput vs solo",
            f"{p['fcfs']['batch_tps'] / p['batch_solo_tps']:.0%}",
            f"{p['priority']['batch_tps'] / p['batch_solo_tps']:.0%} (priority)",
            ">= 70%, never starved",
        ),
        (
            "4 overload 2x, TTFT 0.5 s / TPOT 50 ms",
            "goodput (req/s)",
            f"{o['fcfs']['goodput_rps']:.1f}",
            f"{o['slo']['goodput_rps']:.1f} (SLO-aware, {o['slo']['refused']} of {o['slo']['sent']} refused)",
            ">= 1.5x FCFS",
        ),
    ]
    print("| scenario | measure | FCFS | policy | target |\n| --- | --- | --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    done(out)


if __name__ == "__main__":
    main()
