"""Scheduling-policy names and the registry that builds a policy from one.

The one list of policy names in the project: a gateway validates its ``policy`` setting with
``parse_policy`` (torch-free), and ``make_policy`` builds what it accepts. Names compose with "+":
the ordering parts ("fcfs", "priority", "vtc", "priority+vtc") choose the class that keeps the
queue, and a wrapping part ("slo") is built around it. The policy modules never import this one.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.config import SchedulerConfig
from engine.scheduler.policy import FCFSPolicy, SchedulingPolicy
from engine.scheduler.priority import PriorityPolicy
from engine.scheduler.slo import SLOPolicy
from engine.scheduler.vtc import PriorityVTCPolicy, VTCPolicy

POLICY_PARTS = ("fcfs", "priority", "vtc", "slo")  # "slo" wraps any of the others: "priority+vtc+slo"

# The ordering parts of a name, in POLICY_PARTS order and joined by "+", or a wrapping part -> its class.
POLICIES: dict[str, type[SchedulingPolicy]] = {
    cls.name: cls for cls in (FCFSPolicy, PriorityPolicy, VTCPolicy, PriorityVTCPolicy, SLOPolicy)
}


def parse_policy(name: str) -> tuple[str, ...]:
    """The parts of a policy name ("priority+vtc+slo" -> ("priority", "vtc", "slo")); a ValueError
    naming the unknown parts, or a repeated one, otherwise."""
    parts = tuple(p.strip() for p in name.split("+"))
    unknown = [p for p in parts if p not in POLICY_PARTS]
    if unknown or len(set(parts)) != len(parts):
        what = f"unknown part(s) {unknown}" if unknown else "a part given twice"
        raise ValueError(
            f"scheduling policy {name!r} has {what}: compose {', '.join(POLICY_PARTS)} with '+', "
            "e.g. 'priority+vtc+slo'"
        )
    return parts


def make_policy(
    name: str, config: SchedulerConfig | None = None, *, clock: Callable[[], float] | None = None
) -> SchedulingPolicy:
    """Build the policy `name` ("priority+vtc+slo": tiers, fairness inside each tier, SLO-aware
    admission around both; "slo" alone wraps FCFS). `config` is the SchedulerConfig, `clock` the
    time source of SLO policies (default monotonic). A ValueError for a name parse_policy refuses
    or a combination no policy implements ("fcfs+vtc")."""
    parts = parse_policy(name)
    ordering = sorted((p for p in parts if not POLICIES[p].wraps), key=POLICY_PARTS.index)
    cls = POLICIES.get("+".join(ordering) or "fcfs")
    if cls is None:
        known = [k for k, c in POLICIES.items() if not c.wraps]
        raise ValueError(
            f"scheduling policy {name!r}: no policy orders by {'+'.join(ordering)!r}; the "
            f"orderings are {known}, each optionally with '+slo' (e.g. 'priority+vtc+slo')"
        )
    policy = cls(config, clock=clock)
    for part in parts:
        if POLICIES[part].wraps:
            policy = POLICIES[part](config, clock=clock, inner=policy)
    return policy
