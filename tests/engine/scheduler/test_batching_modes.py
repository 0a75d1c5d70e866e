"""Static and dynamic batching, the baselines continuous batching is compared with (scheduler
decisions on hand-built states; the tokens they produce on the real model are in
tests/engine/test_batching_tokens.py)."""

import pytest

from engine.config import SchedulerConfig
from tests.engine.scheduler.helpers import ids, make, run_step, seq


def test_static_starts_a_batch_only_when_the_engine_is_empty():
    s = make("fcfs", batching="static", max_num_seqs=2)
    a, b, c, d = seq("a", 4), seq("b", 4), seq("c", 4), seq("d", 4)
    for q in (a, b, c):
        s.add(q)
    assert ids(run_step(s).scheduled) == ["a", "b"]
    s.add(d)
    s.finish(a)  # a short member ends: continuous batching would start c now, static does not
    for _ in range(3):
        assert ids(run_step(s).scheduled) == ["b"]
    s.finish(b)
    assert ids(run_step(s).scheduled) == ["c", "d"]  # the next batch, once the engine is empty


def test_continuous_fills_a_freed_slot_at_once():
    s = make("fcfs", max_num_seqs=2)
    a, b, c = seq("a", 4), seq("b", 4), seq("c", 4)
    for q in (a, b, c):
        s.add(q)
    run_step(s)
    s.finish(a)
    assert ids(run_step(s).scheduled) == ["b", "c"]


def test_a_static_batch_whose_prompts_exceed_the_token_budget_is_admitted_over_several_steps():
    s = make("fcfs", batching="static", max_num_seqs=3, max_num_batched_tokens=8)
    a, b, c, late = seq("a", 6), seq("b", 6), seq("c", 6), seq("late", 2)
    for q in (a, b, c):
        s.add(q)
    started = set(ids(run_step(s).scheduled))
    s.add(late)  # arrives while the batch is still being prefilled
    for _ in range(3):
        started |= set(ids(run_step(s).scheduled))
    assert started == {"a", "b", "c"}  # chunk by chunk, the members only


def test_dynamic_waits_for_a_full_batch_or_the_window():
    now = [100.0]
    s = make("fcfs", batching="dynamic", max_num_seqs=3, batch_wait_s=0.5, clock=lambda: now[0])
    a, b = seq("a", 4, arrival=100.0), seq("b", 4, arrival=100.1)
    s.add(a)
    s.add(b)
    assert run_step(s).scheduled == []  # 2 of 3 waiting, the oldest for 0 s
    now[0] = 100.4
    assert run_step(s).scheduled == []
    now[0] = 100.5  # the oldest has waited the window: the batch starts with what is there
    assert ids(run_step(s).scheduled) == ["a", "b"]


def test_dynamic_starts_at_once_when_the_batch_is_full():
    now = [100.0]
    s = make("fcfs", batching="dynamic", max_num_seqs=2, batch_wait_s=10, clock=lambda: now[0])
    for r in "ab":
        s.add(seq(r, 4, arrival=100.0))
    assert ids(run_step(s).scheduled) == ["a", "b"]


def test_a_preempted_member_of_a_static_batch_is_readmitted_before_the_next_batch():
    s = make("fcfs", batching="static", max_num_seqs=2, num_blocks=4, block_size=4, max_num_batched_tokens=64)
    a, b, c = seq("a", 7), seq("b", 7), seq("c", 4)
    for q in (a, b, c):
        s.add(q)
    seen_c_with_b_waiting = False
    for _ in range(12):
        plan = run_step(s)
        if "c" in ids(plan.scheduled) and b.status.value == "waiting":
            seen_c_with_b_waiting = True
        for q in list(s.running):
            if q.num_output_tokens >= 3:
                s.finish(q)
    assert not seen_c_with_b_waiting
    assert a.num_preemptions + b.num_preemptions >= 1  # 4 blocks of 4 cannot hold both as they grow


def test_unknown_batching_mode_is_refused():
    with pytest.raises(ValueError, match="batching"):
        SchedulerConfig(batching="bursty")
