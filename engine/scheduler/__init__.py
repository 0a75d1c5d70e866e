"""Scheduling: one step's plan over the block manager, with pluggable policies (docs/scheduling.md)."""
from engine.scheduler.cost_model import StepCostModel
from engine.scheduler.plan import ScheduledSeq, StepPlan
from engine.scheduler.policy import POLICIES, FCFSPolicy, SchedulingPolicy, make_policy, register_policy
from engine.scheduler.preemption import PreemptionChooser, SwapCost
from engine.scheduler.scheduler import Scheduler
from engine.scheduler.slo import SLOLoad, SLOPolicy
from engine.scheduler.tiered import PriorityPolicy, PriorityVTCPolicy, TieredPolicy, VTCPolicy

__all__ = [
    "POLICIES",
    "FCFSPolicy",
    "PreemptionChooser",
    "PriorityPolicy",
    "PriorityVTCPolicy",
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
    "register_policy",
]
