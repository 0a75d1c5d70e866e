"""A scheduling simulator: the real Scheduler and BlockManager in virtual time, a step-cost model
instead of a forward (simulator.py), and the four scheduling scenarios run on it (scenarios.py).
Plain Python, no torch; `python -m benchmarks.sched_sim` runs the scenarios (docs/scheduling.md).
"""

from engine.sim.simulator import (
    SimReport,
    SimRequest,
    Simulator,
    StepCost,
    backlog,
    bursty_trace,
    percentile,
    poisson_trace,
)

__all__ = [
    "SimReport",
    "SimRequest",
    "Simulator",
    "StepCost",
    "backlog",
    "bursty_trace",
    "percentile",
    "poisson_trace",
]
