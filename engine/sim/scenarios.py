"""The four scheduling scenarios on the simulator: fairness, a noisy neighbour, priority tiers and
overload (shared by the tests and benchmarks/sched_sim.py). Each returns a dict of numbers plus the
reports behind them."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

from engine.config import SchedulerConfig
from engine.sim.simulator import (
    SimReport,
    SimRequest,
    Simulator,
    StepCost,
    backlog,
    bursty_trace,
    poisson_trace,
)

# One simulated engine: 32768 KV tokens, 256 tokens a step, 64 sequences, GPU-like step costs
# (simulator.StepCost). 64 sequences keep a decode step near the light steps a lone tenant sees (256
# would add 25 ms of decodes to every 20 ms step); the policies are compared on the same engine.
BASE = SchedulerConfig(block_size=16, watermark=0.0, max_num_seqs=64, max_num_batched_tokens=256)
NUM_BLOCKS = 2048
COST = StepCost()
SHAPE: dict[str, Any] = dict(prompt_len=(64, 128), output_len=(32, 64))


def simulate(
    policy: str, trace: list[SimRequest], config: SchedulerConfig = BASE, until: float | None = None
) -> SimReport:
    return Simulator(replace(config, policy=policy), NUM_BLOCKS, COST).run(trace, until=until)


def capacity(config: SchedulerConfig = BASE, seed: int = 0) -> float:
    """Requests/s the engine finishes when saturated with SHAPE requests (FCFS backlog)."""
    report = simulate("fcfs", backlog(400, random.Random(seed), **SHAPE), config)
    return len(report.requests) / report.duration


def fairness(n: int = 150, seed: int = 0) -> dict[str, Any]:
    """1. Two backlogged tenants of weights 1 and 2: max |S_A/1 - S_B/2| while both are backlogged,
    against the VTC bound 2U, U = max(w_in * max_input, w_out * max_output)."""
    out: dict[str, Any] = {
        "bound": 2
        * max(BASE.vtc_input_weight * SHAPE["prompt_len"][1], BASE.vtc_output_weight * SHAPE["output_len"][1])
    }
    for policy in ("fcfs", "vtc"):
        rng = random.Random(seed)
        a = backlog(n, rng, tenant="A", weight=1.0, **SHAPE)
        b = backlog(n, rng, tenant="B", weight=2.0, **SHAPE)
        trace = [r for pair in zip(a, b) for r in pair]
        report = simulate(policy, trace)
        # both are backlogged until the first of them has every request started
        end = min(
            max(r.first_token for r in report.select(tenant=t) if r.first_token is not None) for t in "AB"
        )
        diff = [
            abs(x - y) for t, x, y in zip(report.times, report.service["A"], report.service["B"]) if t <= end
        ]
        out[policy] = {"max_diff": max(diff), "report": report, "backlogged_until": end}
    return out


def noisy_neighbour(duration: float = 20.0, seed: int = 1) -> dict[str, Any]:
    """2. Tenant A at 2x capacity, tenant B at a tenth of A's rate: B's p99 TTFT, solo and shared."""
    cap = capacity()
    a = poisson_trace(2 * cap, duration, random.Random(seed), tenant="A", **SHAPE)
    b = poisson_trace(0.2 * cap, duration, random.Random(seed + 1), tenant="B", **SHAPE)
    solo = simulate("fcfs", [replace(r) for r in b])
    out: dict[str, Any] = {"capacity_rps": cap, "b_solo_p99": solo.ttft_p(99, tenant="B")}
    for policy in ("fcfs", "vtc"):
        report = simulate(policy, [replace(r) for r in a + b], until=duration)
        out[policy] = {
            "b_p99": report.ttft_p(99, tenant="B"),
            "a_p99": report.ttft_p(99, tenant="A"),
            "b_started": len(report.ttfts(tenant="B")),
            "b_sent": len(b),
            "report": report,
        }
    return out


def priority(duration: float = 20.0, seed: int = 2) -> dict[str, Any]:
    """3. Interactive tier (priority 1) at 20% of capacity beside a saturating batch tier (0)."""
    cap = capacity()
    inter = poisson_trace(0.2 * cap, duration, random.Random(seed), tenant="interactive", priority=1, **SHAPE)
    batch = backlog(int(1.5 * cap * duration), random.Random(seed + 1), tenant="batch", priority=0, **SHAPE)
    out: dict[str, Any] = {"capacity_rps": cap}
    out["inter_solo_p99"] = simulate("priority", [replace(r) for r in inter]).ttft_p(99, priority=1)
    solo = simulate("priority", [replace(r) for r in batch], until=duration)
    out["batch_solo_tps"] = solo.throughput(until=duration, priority=0)
    for policy in ("fcfs", "priority"):
        report = simulate(policy, [replace(r) for r in inter + batch], until=duration)
        windows = [0.0] * int(duration)  # batch output tokens finished per second
        for r in report.finished(priority=0):
            if r.finish is not None and r.finish < duration:
                windows[int(r.finish)] += r.output_len
        out[policy] = {
            "inter_p99": report.ttft_p(99, priority=1),
            "batch_tps": report.throughput(until=duration, priority=0),
            "batch_min_window_tokens": min(windows[1:]),
            "preemptions": report.preemptions,
            "report": report,
        }
    return out


def overload(duration: float = 20.0, seed: int = 3, ttft: float = 0.5, tpot: float = 0.05) -> dict[str, Any]:
    """4. Bursty arrivals at 2x capacity, every request with TTFT and TPOT targets: goodput."""
    cap = capacity()
    trace = bursty_trace(
        2 * cap, duration, random.Random(seed), burst=5, ttft_target_s=ttft, tpot_target_s=tpot, **SHAPE
    )
    out: dict[str, Any] = {"capacity_rps": cap, "ttft_target_s": ttft, "tpot_target_s": tpot}
    for policy in ("fcfs", "slo"):
        report = simulate(policy, [replace(r) for r in trace], until=2 * duration)
        out[policy] = {
            "goodput_rps": sum(r.met_slo() for r in report.requests) / duration,
            "refused": sum(r.refused for r in report.requests),
            "sent": len(trace),
            "ttft_p99": report.ttft_p(99),
            "report": report,
        }
    return out
