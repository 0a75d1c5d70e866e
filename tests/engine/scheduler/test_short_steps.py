"""Short steps while urgent work is present (SchedulerConfig.urgent_step_overhead): a step without an
urgent prefill is cut to the tokens at which its fixed cost (step-cost model) is that share of its
time (decodes always run), so an urgent arrival waits behind a shorter step; the cut chunks keep
their blocks and go on next step. The costs here are the model's prior (no step is measured)."""

import pytest
from helpers import ids, make, run_step, seq

from engine import Engine, SamplingParams
from engine.config import SchedulerConfig
from engine.scheduler.cost_model import StepCostModel
from tests.engine.test_events import TINY

# CPU-like: 4.1 ms a step + 0.375 ms a token; a quarter of the step fixed at 32 tokens
CPU = dict(cost_step_s=0.0041, cost_prefill_token_s=0.000375)
GPU = dict(cost_step_s=0.02, cost_prefill_token_s=0.00002)  # mostly fixed: nothing is cut


def tokens(plan) -> dict[str, int]:
    return {it.seq.request_id: it.num_tokens for it in plan.scheduled}


def settle(s) -> None:
    """Run steps until every running sequence decodes."""
    while any(not it.is_decode for it in run_step(s).scheduled):
        pass


def test_the_step_shrinks_while_a_higher_tier_runs():
    s = make("priority", max_num_batched_tokens=64, **CPU)  # 32 tokens
    s.add(seq("hi", 8, priority=1))
    run_step(s)  # hi decodes from now on
    s.add(seq("b", 60, priority=0))
    plan = run_step(s)
    assert tokens(plan) == {"hi": 1, "b": 31}  # not 63: the step is half the budget
    assert plan.num_tokens == 32 and s.block_manager.table(plan.scheduled[-1].seq)
    plan = run_step(s)
    assert tokens(plan) == {"hi": 1, "b": 29}  # the rest of the prompt: nothing was lost


def test_full_steps_for_one_tier_when_off_and_when_a_step_costs_mostly_the_same():
    cases = (("priority", 0.25, 0, CPU), ("priority", 0.0, 1, CPU), ("fcfs", 0.25, 1, CPU))
    for policy, share, tier, cost in (*cases, ("priority", 0.25, 1, GPU)):
        s = make(policy, max_num_batched_tokens=64, urgent_step_overhead=share, **cost)
        s.add(seq("hi", 8, priority=tier))
        run_step(s)
        s.add(seq("b", 60, priority=0))
        assert tokens(run_step(s)) == {"hi": 1, "b": 60}, (policy, share, cost)


def test_decodes_always_run_in_a_short_step():
    s = make("priority", max_num_batched_tokens=16, cost_step_s=1e-5)  # 4: a quarter of the budget
    for i in range(6):
        s.add(seq(f"b{i}", 2, priority=0))
    run_step(s)  # the batch prompts (one tier: a full step)
    s.add(seq("hi", 4, priority=1))
    run_step(s)  # the high tier's prompt beside the decodes
    s.add(seq("b6", 8, priority=0))
    plan = run_step(s)
    assert sorted(ids(plan.scheduled)) == sorted(["hi"] + [f"b{i}" for i in range(6)])
    assert all(it.num_tokens == 1 for it in plan.scheduled)  # 7 decodes > the cap of 4: all run
    assert s.num_waiting == 1  # b6 does not start in a step already past the cap


def test_an_urgent_arrival_prefills_whole_in_the_next_step_without_bulk_chunks():
    s = make("priority", max_num_batched_tokens=64, **CPU)
    s.add(seq("h0", 4, priority=1))
    run_step(s)
    s.add(seq("b", 120, priority=0))
    assert tokens(run_step(s)) == {"h0": 1, "b": 31}
    s.add(seq("hi", 40, priority=1))  # arrives during that short step
    plan = run_step(s)
    # its whole prompt (more than the short step's 32 tokens) beside the decodes, b's chunk waits
    assert tokens(plan) == {"h0": 1, "hi": 40}
    assert tokens(run_step(s)) == {"h0": 1, "hi": 1, "b": 30}


def test_the_step_shrinks_while_a_light_tenant_is_below_its_share():
    s = make("vtc", max_num_batched_tokens=64, **CPU)
    s.add(seq("x0", 4, tenant="X")), s.add(seq("y0", 4, tenant="Y"))
    settle(s)
    s.add(seq("x1", 60, tenant="X"))
    assert tokens(run_step(s))["x1"] == 60  # X and Y at their shares: a full step
    s = make("vtc", max_num_batched_tokens=64, **CPU)
    for i in range(3):
        s.add(seq(f"a{i}", 4, tenant="A"))
    s.add(seq("b0", 4, tenant="B"))
    settle(s)  # 4 decodes: A holds 3, B 1 (share 2 each)
    s.add(seq("a3", 60, tenant="A"))
    s.policy.vtc.counters["A"] += 1000  # A is the more-served: its chunk is the bulk work
    plan = run_step(s)
    assert tokens(plan)["a3"] == 28 and plan.num_tokens == 32


def test_the_more_served_tenants_chunk_is_cut_first():
    s = make("vtc", max_num_batched_tokens=64, **CPU)
    for rid, tenant in (("a0", "A"), ("a1", "A"), ("a2", "A"), ("a3", "A"), ("d0", "D"), ("d1", "D")):
        s.add(seq(rid, 4, tenant=tenant))
    s.add(seq("b0", 4, tenant="B"))
    settle(s)  # A holds 4, D 2, B 1 (share 7/3 each): B is below its share
    s.policy.vtc.counters["A"] += 1000
    s.policy.vtc.counters["D"] += 500
    s.add(seq("a4", 20, tenant="A"))
    s.add(seq("d2", 20, tenant="D"))  # the newest, but of the less-served tenant
    plan = run_step(s)
    # 7 decodes + D's 20 + A's 20 = 47 > 32: the most-served tenant's chunk gives up 15 tokens
    assert tokens(plan)["d2"] == 20 and tokens(plan)["a4"] == 5


def test_the_cap_follows_the_measured_step_cost():
    tokens_at = {}
    for name, step_s, token_s in (("cpu", 0.02, 0.0005), ("gpu", 0.02, 0.00002)):
        s = make("priority", num_blocks=128, max_num_batched_tokens=256)
        s.add(seq("hi", 8, priority=1))
        plan = run_step(s)
        s.observe_step(plan, step_s + token_s * plan.num_tokens)  # the engine's measured steps
        for n in range(1, 257, 8):
            s.step_cost.observe(n, 0, step_s + token_s * n)
        s.add(seq("b", 250, priority=0))
        tokens_at[name] = s.schedule().num_tokens
    # CPU-like: a quarter of the step fixed at 0.06 / 0.0005 = 120 tokens; GPU-like: nothing cut
    assert 110 <= tokens_at["cpu"] <= 121 and tokens_at["gpu"] == 251


class Clock:
    t = 100.0

    def __call__(self) -> float:
        return self.t


def test_steps_stay_short_for_the_horizon_after_urgent_work_left():
    clock = Clock()
    s = make("priority", max_num_batched_tokens=64, clock=clock, urgent_horizon_s=5.0, **CPU)
    hi = seq("hi", 8, priority=1)
    s.add(hi), s.add(seq("b0", 4, priority=0))
    settle(s)  # both tiers decode
    s.finish(hi)  # the last urgent request finished: only the lower tier is left
    clock.t += 4.0
    s.add(seq("b1", 60, priority=0))
    plan = run_step(s)
    assert tokens(plan) == {"b0": 1, "b1": 31}  # 4 s later: still a short step for the next arrival
    clock.t += 1.5  # 5.5 s since urgent work was last present
    s.add(seq("b2", 60, priority=0))
    assert tokens(run_step(s)) == {"b0": 1, "b1": 29, "b2": 34}  # a full step
    s = make("priority", max_num_batched_tokens=64, clock=clock, **CPU)
    s.add(seq("b0", 4, priority=0)), s.add(seq("b1", 60, priority=0))
    assert run_step(s).num_tokens == 64  # never urgent work: full steps


def test_the_share_is_checked():
    with pytest.raises(ValueError, match="urgent_step_overhead"):
        SchedulerConfig(urgent_step_overhead=1.0)
    with pytest.raises(ValueError, match="urgent_horizon_s"):
        SchedulerConfig(urgent_horizon_s=-1.0)


class Fixed(StepCostModel):
    """The CPU-like prior, never refitted: the tiny model's steps cost about the same whatever
    their tokens, so a fitted model would cut nothing."""

    def observe(self, prefill_tokens: int, decode_seqs: int, seconds: float) -> None:
        pass


def tiny_priority_engine(**overrides) -> Engine:
    """A tiny random model under the priority policy, 32 tokens a step, its step cost fixed so that
    the short-step limit is 16 tokens."""
    eng = Engine(
        model="dummy",
        dummy_config=TINY,
        dtype="float32",
        num_threads=1,
        policy="priority",
        max_num_batched_tokens=32,
        **overrides,
    )
    eng.scheduler.step_cost = Fixed(0.0041, 0.00075, 0.00075)  # a quarter fixed at 16 tokens
    return eng


def engine_run(share: float) -> tuple[dict[str, list[int]], list[tuple[int, bool]]]:
    """A high-tier request decoding beside a batch backlog on a tiny random model: each request's
    greedy tokens, and per step (tokens computed, whether a high-tier request was running)."""
    eng = tiny_priority_engine(urgent_step_overhead=share)
    greedy = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    eng.add_request("hi", list(range(10, 18)), greedy, priority=1)
    eng.step()
    for i in range(4):
        eng.add_request(f"b{i}", list(range(20 + i, 60 + i)), greedy, priority=0)
    out: dict[str, list[int]] = {}
    steps = []
    while eng.has_unfinished():
        high = any(s.priority == 1 for s in eng.scheduler.running)
        for o in eng.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
        steps.append((eng.stats.last_step_tokens, high))
    return out, steps


def test_engine_keeps_steps_short_beside_a_high_tier_and_the_same_tokens():
    short, steps = engine_run(0.25)
    full, full_steps = engine_run(0.0)
    assert short == full  # greedy tokens do not depend on how prompts are chunked
    # while "hi" decodes, no step computes more than 16 tokens (5 decodes at most beside it)
    assert max(n for n, high in steps if high) <= 16
    assert max(n for n, high in full_steps if high) > 16  # off: full 32-token steps
