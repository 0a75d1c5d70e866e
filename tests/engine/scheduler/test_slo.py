"""SLO-aware admission: the step-cost model, refusal at arrival and while waiting, demotion,
the TPOT guard, and the engine's surface of refusals."""

import pytest
from helpers import make, run_step, seq

from engine.errors import EngineError, SLOUnattainableError
from engine.scheduler.cost_model import StepCostModel


class Clock:
    t = 100.0

    def __call__(self):
        return self.t


def test_cost_model_learns_measured_step_costs():
    m = StepCostModel(0.01, 0.001, 0.01)  # a wrong prior
    for p, d in [(0, 4), (100, 2), (50, 8), (200, 0), (10, 16)] * 40:
        m.observe(p, d, 0.02 + 0.0001 * p + 0.0005 * d)
    assert m.predict(300, 10) == pytest.approx(0.02 + 0.03 + 0.005, rel=0.05)


def test_refused_at_arrival_when_the_queue_ahead_is_too_long():
    clock = Clock()
    s = make("slo", clock=clock, max_num_batched_tokens=64, cost_step_s=0.01, cost_prefill_token_s=0.001)
    for i in range(5):
        s.add(seq(f"w{i}", 64, arrival=clock.t))
    with pytest.raises(SLOUnattainableError) as info:
        s.add(seq("late", 64, arrival=clock.t, ttft_target_s=0.2))
    err = info.value
    assert isinstance(err, EngineError) and err.code == "slo_unattainable" and err.retry_after >= 1
    assert err.predicted_ttft_s > 0.2 and s.num_waiting == 5
    s.add(seq("ok", 8, arrival=clock.t, ttft_target_s=10.0))  # a loose target is admitted
    assert s.predict_ttft(64) == pytest.approx(s.policy.predict_ttft(64, 0, []))


def test_waiting_request_past_its_target_is_refused_before_it_starts():
    clock = Clock()
    s = make("slo", clock=clock, max_num_seqs=1)
    s.add(seq("run", 4, arrival=clock.t, max_tokens=50))
    run_step(s)
    waiter = seq("w", 4, arrival=clock.t, ttft_target_s=0.5)
    s.add(waiter)
    clock.t += 1.0
    plan = s.schedule()
    assert [(q.request_id, e.code) for q, e in plan.refused] == [("w", "slo_unattainable")]
    assert waiter.is_finished and s.num_waiting == 0


def test_demotion_instead_of_refusal():
    clock = Clock()
    s = make("priority+slo", clock=clock, max_num_seqs=1, slo_demote=True, tier_ttft_targets={1: 0.5})
    s.add(seq("run", 4, arrival=clock.t, priority=1, max_tokens=50))
    run_step(s)
    w = seq("w", 4, arrival=clock.t, priority=1)
    s.add(w)
    clock.t += 1.0
    plan = s.schedule()
    assert not plan.refused and w.priority == 0 and s.num_waiting == 1


def test_tpot_guard_stops_adding_decodes():
    s = make("slo", clock=Clock(), cost_step_s=0.01, cost_decode_seq_s=0.01, tier_tpot_targets={0: 0.035})
    for i in range(5):
        s.add(seq(f"s{i}", 2))
    run_step(s)
    assert len(s.running) == 2  # a third would make the decode step 0.04 s > 0.035 s


def test_engine_reports_refusals(tiny_model_dir):
    from engine import Engine, SamplingParams

    eng = Engine(
        model=str(tiny_model_dir),
        dtype="float32",
        block_size=4,
        kv_cache_gib=0.01,
        policy="slo",
        max_num_seqs=1,
    )
    p = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    eng.add_request("a", [5, 6, 7], p)
    eng.step()
    assert eng.predict_ttft(3) is not None
    with pytest.raises(SLOUnattainableError):
        eng.add_request("b", [5, 6, 7], p, ttft_target_s=1e-9)
    assert "b" not in eng.seqs
    eng.add_request("c", [5, 6, 7], p, ttft_target_s=60.0)
    eng.seqs["c"].arrival_time -= 100  # as if it had waited for ages
    outs = eng.step()
    refused = [o for o in outs if o.request_id == "c"]
    assert refused and refused[0].finish_reason == "slo_unattainable" and refused[0].error.retry_after >= 1
    assert "c" not in eng.seqs


def test_slo_wraps_the_named_policy_even_while_its_queue_is_empty():
    from engine.scheduler import PriorityVTCPolicy, make_policy

    policy = make_policy("priority+vtc+slo")
    assert isinstance(policy.inner, PriorityVTCPolicy)  # an empty queue is falsy: it must still be kept


def test_load_holds_what_predict_ttft_reads():
    clock = Clock()
    s = make(
        "priority+slo",
        clock=clock,
        max_num_batched_tokens=128,
        max_num_seqs=2,
        cost_step_s=0.01,
        cost_prefill_token_s=0.001,
        cost_decode_seq_s=0.002,
    )
    for i, priority in enumerate((1, 2, 2)):
        s.add(seq(f"w{i}", 40, arrival=clock.t, priority=priority))
    load = s.policy.load([])
    assert load.waiting_tokens == {1: 40, 2: 80} and load.tiered and load.running == 0
    assert (load.step_s, load.prefill_token_s, load.decode_seq_s) == (0.01, 0.001, 0.002)
    assert (load.max_num_batched_tokens, load.max_num_seqs, load.slot_wait_s) == (128, 2, 0.0)
    run_step(s)  # two start (the sequence cap): the third waits for a slot
    load = s.slo_load()
    assert load.running == 2 and load.slot_wait_s > 0 and sum(load.waiting_tokens.values()) == 40
