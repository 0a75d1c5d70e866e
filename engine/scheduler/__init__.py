"""Scheduling: one step's plan over the block manager, with pluggable policies (docs/scheduling.md).

policy.py declares the interface every policy implements; registry.py builds one by name.
"""

from engine.scheduler.cost_model import StepCostModel
from engine.scheduler.load import SLOLoad, predict_ttft
from engine.scheduler.plan import ScheduledSeq, StepPlan
from engine.scheduler.policy import FCFSPolicy, SchedulingPolicy
from engine.scheduler.preemption import PreemptionChooser, SwapCost
from engine.scheduler.priority import PriorityPolicy, TieredPolicy
from engine.scheduler.registry import POLICIES, POLICY_PARTS, make_policy, parse_policy
from engine.scheduler.room import Room
from engine.scheduler.scheduler import Scheduler
from engine.scheduler.slo import SLOPolicy
from engine.scheduler.vtc import FairTieredPolicy, PriorityVTCPolicy, VTCPolicy

__all__ = [
    "POLICIES",
    "POLICY_PARTS",
    "FCFSPolicy",
    "FairTieredPolicy",
    "PreemptionChooser",
    "PriorityPolicy",
    "PriorityVTCPolicy",
    "Room",
    "SLOLoad",
    "SLOPolicy",
    "ScheduledSeq",
    "Scheduler",
    "SchedulingPolicy",
    "StepCostModel",
    "StepPlan",
    "SwapCost",
    "TieredPolicy",
    "VTCPolicy",
    "make_policy",
    "parse_policy",
    "predict_ttft",
]
