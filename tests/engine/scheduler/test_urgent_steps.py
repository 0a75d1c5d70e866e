"""An urgent prompt's own step (engine/scheduler/urgent.py): while steps are kept short, the lower
tiers' decodes sit it out (SchedulerConfig.urgent_prefill_defers_decodes), never two steps in a row;
a second urgent prompt that would be split starts whole in the next step; a sequence admitted in a
step is not pushed out of it for the budget. The costs here are the model's prior."""

import pytest
from helpers import ids, make, run_step, seq

from engine import SamplingParams
from tests.engine.scheduler.test_short_steps import CPU, GPU, settle, tiny_priority_engine, tokens


def backlog(s, n: int = 4) -> None:
    """n lower-tier sequences and one high-tier one, all decoding."""
    for i in range(n):
        s.add(seq(f"b{i}", 4, priority=0))
    s.add(seq("h0", 4, priority=1))
    settle(s)


def test_lower_tier_decodes_sit_out_an_urgent_prompts_step():
    s = make("priority", max_num_batched_tokens=64, **CPU)  # steps of 32 tokens beside urgent work
    backlog(s)
    s.add(seq("hi", 40, priority=1))
    plan = run_step(s)
    assert tokens(plan) == {"h0": 1, "hi": 40}  # not 45: b0-b3 decode next step
    assert sorted(ids(run_step(s).scheduled)) == ["b0", "b1", "b2", "b3", "h0", "hi"]


def test_a_decode_sits_out_at_most_one_step_in_two():
    s = make("priority", max_num_batched_tokens=64, **CPU)
    backlog(s)
    for name in ("hi1", "hi2", "hi3"):
        s.add(seq(name, 40, priority=1))  # each arrives as the one before is prefilled
        plan = run_step(s)
        assert name in ids(plan.scheduled)
        yield_b = sorted(r for r in ids(plan.scheduled) if r.startswith("b"))
        assert yield_b == ([] if name != "hi2" else ["b0", "b1", "b2", "b3"]), name


def test_decodes_stay_where_a_step_costs_about_the_same_or_when_off():
    for cost, defer in ((GPU, True), (CPU, False)):
        s = make("priority", max_num_batched_tokens=64, urgent_prefill_defers_decodes=defer, **cost)
        backlog(s)
        s.add(seq("hi", 40, priority=1))
        assert tokens(run_step(s)) == {"b0": 1, "b1": 1, "b2": 1, "b3": 1, "h0": 1, "hi": 40}, cost


def test_a_light_tenants_prompt_defers_only_a_more_served_tenants_decodes():
    for heavier, deferred in (("A", True), ("B", False)):
        s = make("vtc", max_num_batched_tokens=64, **CPU)
        for i in range(4):
            s.add(seq(f"a{i}", 4, tenant="A"))
        s.add(seq("b0", 4, tenant="B"))
        settle(s)  # A holds 4, B 1 (share 2.5 each): B's next prompt is urgent
        s.policy.vtc.counters[heavier] += 1000
        s.add(seq("b1", 40, tenant="B"))
        plan = tokens(run_step(s))
        a_decodes = {f"a{i}": 1 for i in range(4)}
        assert plan == {"b0": 1, "b1": 40, **({} if deferred else a_decodes)}, heavier


@pytest.mark.parametrize("costs", ["cpu", "gpu"])
def test_a_second_urgent_prompt_starts_whole_in_the_next_step_where_steps_are_kept_short(costs):
    s = make("priority", max_num_batched_tokens=64, **(CPU if costs == "cpu" else GPU))
    s.add(seq("b0", 4, priority=0))
    settle(s)
    s.add(seq("hi1", 40, priority=1))
    s.add(seq("hi2", 40, priority=1))
    if costs == "gpu":  # a step costs the same whatever its tokens: split (b0 gave hi2 its token)
        assert tokens(run_step(s)) == {"hi1": 40, "hi2": 24}
        return
    assert tokens(run_step(s)) == {"hi1": 40}  # not 23 tokens of hi2 beside it (b0 sits it out)
    assert tokens(run_step(s)) == {"b0": 1, "hi1": 1, "hi2": 40}


def test_a_sequence_admitted_in_a_step_is_not_pushed_out_of_it_for_the_budget():
    s = make("vtc", max_num_batched_tokens=64)
    s.add(seq("a0", 4, tenant="A")), s.add(seq("a1", 4, tenant="A"))
    settle(s)
    s.add(seq("b0", 40, tenant="B"))  # B goes first (tied counters, fewer requests)
    s.add(seq("a2", 30, tenant="A"))  # once b0's prompt is booked, A is the less served
    plan = run_step(s)
    # b0 started and keeps its whole prompt: a2 does not take its tokens in the same step
    assert tokens(plan)["b0"] == 40 and "a2" not in tokens(plan)


def engine_run(defer: bool) -> tuple[dict[str, list[int]], int]:
    """High-tier requests arriving beside decoding batch requests on a tiny random model: each
    request's greedy tokens, and how many steps left lower-tier decodes out."""
    eng = tiny_priority_engine(urgent_prefill_defers_decodes=defer)
    greedy = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    eng.add_request("h0", list(range(10, 14)), greedy, priority=1)
    for i in range(6):
        eng.add_request(f"b{i}", list(range(20 + i, 28 + i)), greedy, priority=0)
    out: dict[str, list[int]] = {}
    deferring, step = 0, 0
    while eng.has_unfinished():
        if step in (4, 7):
            eng.add_request(f"hi{step}", list(range(30 + step, 44 + step)), greedy, priority=1)
        for o in eng.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
        deferring += bool(eng.scheduler._deferred)
        step += 1
    return out, deferring


def test_engine_greedy_tokens_do_not_depend_on_deferred_decodes():
    deferred, n = engine_run(True)
    plain, m = engine_run(False)
    assert n > 0 and m == 0  # decodes did sit out steps
    assert deferred == plain
