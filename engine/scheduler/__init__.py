"""Scheduling: one step's plan over the block manager, with pluggable policies."""
from engine.scheduler.plan import ScheduledSeq, StepPlan
from engine.scheduler.policy import POLICIES, FCFSPolicy, SchedulingPolicy, make_policy, register_policy
from engine.scheduler.scheduler import Scheduler

__all__ = [
    "POLICIES",
    "FCFSPolicy",
    "ScheduledSeq",
    "Scheduler",
    "SchedulingPolicy",
    "StepPlan",
    "make_policy",
    "register_policy",
]
