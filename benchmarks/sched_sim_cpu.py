"""Scenarios 1-3 of benchmarks.scheduling (same engine limits, request shapes and traces) on the
simulator with a CPU-like step cost, against the short steps beside urgent work
(`urgent_step_overhead`), with them off and without two of their parts: deterministic, so the
comparison does not depend on the load of a shared machine the way the real engine's wall-clock
runs do.

    python -m benchmarks.sched_sim_cpu                    # about a minute on one core
    python -m benchmarks.sched_sim_cpu --step-s 0.02      # a larger fixed cost per step

The default cost (10 ms a step + 0.6 ms per prefill token or decoding sequence) is near what
SmolLM2 bf16 does on 2 Zen 4 cores (benchmarks.scheduling: ~15 requests/s, ~450 batch tokens/s).
Writes sched_sim_cpu.json and .png under --out (benchmarks/results) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import replace

from benchmarks.common import add_common_args, done, out_dir
from engine.config import SchedulerConfig
from engine.sim.simulator import Simulator, StepCost, backlog, poisson_trace

SHAPE = dict(prompt_len=(32, 96), output_len=(16, 48))  # benchmarks.scheduling's
ENGINE = SchedulerConfig(block_size=16, watermark=0.01, max_num_seqs=32, max_num_batched_tokens=128)
NUM_BLOCKS = 4096
VARIANTS = {
    "off": {"urgent_step_overhead": 0.0},
    "urgent_horizon_s=5": {"urgent_horizon_s": 5.0},
    "urgent_prefill_defers_decodes=false": {"urgent_prefill_defers_decodes": False},
    "short steps (default)": {},
}


def sim(cost: StepCost, policy: str, trace, until: float | None = None, **config):
    config = replace(ENGINE, policy=policy, **config)
    return Simulator(config, NUM_BLOCKS, cost).run([replace(r) for r in trace], until=until)


def measure(cost: StepCost, duration: float, n_backlog: int) -> dict:
    report = sim(cost, "fcfs", backlog(64, random.Random(0), **SHAPE))
    cap = len(report.requests) / report.duration
    inter = poisson_trace(0.2 * cap, duration, random.Random(3), tenant="interactive", priority=1, **SHAPE)
    batch = backlog(int(1.5 * cap * duration), random.Random(4), tenant="batch", priority=0, **SHAPE)
    heavy = poisson_trace(2 * cap, duration, random.Random(1), tenant="A", **SHAPE)
    light = poisson_trace(0.2 * cap, duration, random.Random(2), tenant="B", **SHAPE)
    rng = random.Random(0)
    a = backlog(n_backlog, rng, tenant="A", weight=1.0, **SHAPE)
    b = backlog(n_backlog, rng, tenant="B", weight=2.0, **SHAPE)
    pairs = [r for pair in zip(a, b) for r in pair]
    out = {
        "capacity_rps": cap,
        "inter_solo_p99": sim(cost, "priority", inter).ttft_p(99, priority=1),
        "batch_solo_tps": sim(cost, "priority", batch, until=duration).throughput(until=duration, priority=0),
        "b_solo_p99": sim(cost, "fcfs", light).ttft_p(99, tenant="B"),
        "bound": 2 * max(SHAPE["prompt_len"][1], 2.0 * SHAPE["output_len"][1]),
    }
    for name, config in VARIANTS.items():
        pr = sim(cost, "priority", inter + batch, until=duration, **config)
        nn = sim(cost, "vtc", heavy + light, until=duration, **config)
        fair = sim(cost, "vtc", pairs, **config)
        end = min(max(r.first_token for r in fair.select(tenant=t)) for t in "AB")
        gap = max(abs(x - y) for t, x, y in zip(fair.times, fair.service["A"], fair.service["B"]) if t <= end)
        out[name] = {
            "inter_p99": pr.ttft_p(99, priority=1),
            "batch_tps": pr.throughput(until=duration, priority=0),
            "b_p99": nn.ttft_p(99, tenant="B"),
            "fairness_gap": gap,
        }
    return out


def table(r: dict) -> str:
    rows = [
        "| variant | interactive p99 TTFT / solo | batch tok/s / solo | light tenant p99 TTFT / solo "
        f"| fairness gap (bound {r['bound']:.0f}) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name in VARIANTS:
        v = r[name]
        rows.append(
            f"| {name} | {v['inter_p99'] / r['inter_solo_p99']:.2f}x | "
            f"{v['batch_tps'] / r['batch_solo_tps']:.0%} | {v['b_p99'] / r['b_solo_p99']:.2f}x | "
            f"{v['fairness_gap']:.0f} |"
        )
    return "\n".join(rows)


def plot(r: dict, path) -> None:
    """The three ratios to solo per variant, beside the 1.5x target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = ["interactive p99 / solo", "batch tok/s / solo", "light tenant p99 / solo"]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    width = 0.8 / len(VARIANTS)
    for i, name in enumerate(VARIANTS):
        v = r[name]
        ratios = [
            v["inter_p99"] / r["inter_solo_p99"],
            v["batch_tps"] / r["batch_solo_tps"],
            v["b_p99"] / r["b_solo_p99"],
        ]
        ax.bar([x + i * width for x in range(3)], ratios, width, label=name)
    ax.axhline(1.5, color="grey", linestyle="--", linewidth=1, label="1.5x target")
    ax.set_xticks([x + width * (len(VARIANTS) - 1) / 2 for x in range(3)], labels, fontsize=8)
    cost = r["cost"]
    ax.set_title(
        f"simulator, {cost['step_s'] * 1e3:.0f} ms a step + {cost['prefill_token_s'] * 1e3:.1f} ms a token"
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--step-s", type=float, default=0.010, help="fixed seconds per step")
    ap.add_argument("--token-s", type=float, default=0.0006, help="seconds per prefill token / decode")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of arrivals per scenario")
    add_common_args(ap)
    args = ap.parse_args()
    n_backlog = 24
    if args.smoke:
        args.duration, n_backlog = 2.0, 4
    cost = StepCost(step_s=args.step_s, prefill_token_s=args.token_s, decode_seq_s=args.token_s)
    res = {"cost": vars(cost), "duration_s": args.duration, **measure(cost, args.duration, n_backlog)}
    out = out_dir(args, "sched_sim_cpu")
    (out / "sched_sim_cpu.json").write_text(json.dumps(res, indent=1))
    plot(res, out / "sched_sim_cpu.png")
    print(table(res))
    done(out)


if __name__ == "__main__":
    main()
