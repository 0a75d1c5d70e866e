"""The policy registry and the interface: names build the right policies, one constructor for all,
every hook the scheduler or a wrapping policy calls is declared on SchedulingPolicy."""

import ast
from pathlib import Path

import pytest
from helpers import seq

from engine.config import SchedulerConfig
from engine.scheduler import (
    POLICIES,
    POLICY_PARTS,
    FCFSPolicy,
    PriorityPolicy,
    PriorityVTCPolicy,
    SchedulingPolicy,
    SLOPolicy,
    VTCPolicy,
    make_policy,
    parse_policy,
)

SCHEDULER = Path(__file__).resolve().parents[3] / "engine" / "scheduler"


@pytest.mark.parametrize(
    "name, outer, inner",
    [
        ("fcfs", FCFSPolicy, None),
        ("priority", PriorityPolicy, None),
        ("vtc", VTCPolicy, None),
        ("priority+vtc", PriorityVTCPolicy, None),
        ("vtc+priority", PriorityVTCPolicy, None),
        ("slo", SLOPolicy, FCFSPolicy),
        ("priority+slo", SLOPolicy, PriorityPolicy),
        ("priority+vtc+slo", SLOPolicy, PriorityVTCPolicy),
        (" slo + vtc ", SLOPolicy, VTCPolicy),
    ],
)
def test_names_build_their_policies(name, outer, inner):
    config = SchedulerConfig(max_num_batched_tokens=123)
    policy = make_policy(name, config, clock=lambda: 7.0)
    assert type(policy) is outer and policy.config is config and policy.clock() == 7.0
    if inner is not None:
        assert type(policy.inner) is inner and policy.inner.config is config


@pytest.mark.parametrize(
    "name, message",
    [
        ("lifo", r"unknown part\(s\) \['lifo'\]"),
        ("vtc+vtc", "a part given twice"),
        ("fcfs+vtc", "no policy orders by 'fcfs\\+vtc'"),
        ("fcfs+priority+slo", "no policy orders by"),
    ],
)
def test_names_that_build_nothing_are_refused_by_name(name, message):
    with pytest.raises(ValueError, match=message):
        make_policy(name)


def test_the_names_and_the_registry_agree():
    assert parse_policy("priority+vtc+slo") == ("priority", "vtc", "slo")
    assert {p for key in POLICIES for p in key.split("+")} == set(POLICY_PARTS)
    assert all(cls.name == key for key, cls in POLICIES.items())
    assert [key for key, cls in POLICIES.items() if cls.wraps] == ["slo"]


@pytest.mark.parametrize("cls", list(POLICIES.values()), ids=list(POLICIES))
def test_one_constructor_and_the_defaults_of_the_interface(cls):
    policy = cls(SchedulerConfig(), clock=lambda: 1.0)
    assert isinstance(policy, SchedulingPolicy) and len(policy) == 0 and list(policy.waiting()) == []
    a, b = seq("a", 8, priority=1), seq("b", 8)
    policy.add(a)
    policy.add(b)
    assert len(policy) == 2 and sorted(s.request_id for s in policy.waiting()) == ["a", "b"]
    assert policy.peek() is a  # the first to arrive, and the higher priority
    if cls.wraps:
        assert policy.load([]) is not None and policy.predict_ttft(8) > 0
    else:
        assert policy.load([]) is None and policy.predict_ttft(8) is None
        with pytest.raises(TypeError, match="wraps no other policy"):
            cls(SchedulerConfig(), inner=FCFSPolicy())
    assert policy.tiers == (cls.name.startswith("priority"))


def test_a_wrapper_has_the_tiers_of_what_it_wraps():
    assert make_policy("priority+slo").tiers and not make_policy("vtc+slo").tiers


def _called_hooks(path: Path, receiver: str) -> set[str]:
    """Attribute names used on `self.<receiver>` in a module (its calls of the policy interface)."""
    return {
        node.attr
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == receiver
        and isinstance(node.value.value, ast.Name)
        and node.value.value.id == "self"
    }


def test_every_hook_the_scheduler_and_a_wrapper_call_is_declared_on_the_interface():
    called = _called_hooks(SCHEDULER / "scheduler.py", "policy") | _called_hooks(
        SCHEDULER / "slo.py", "inner"
    )
    assert {"peek", "begin_step", "displace", "waiting", "tiers", "load"} <= called  # (the scan sees them)
    assert called <= set(dir(SchedulingPolicy)), called - set(dir(SchedulingPolicy))


def test_no_hook_is_looked_up_by_name():
    for path in SCHEDULER.glob("*.py"):
        calls = [
            node.func.id
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        ]
        assert not {"getattr", "hasattr"} & set(calls), path.name
