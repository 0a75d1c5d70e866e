"""The fairness scenario's measure (benchmarks/sched_service.py): prompt tokens counted as their
chunks are computed, once each, and the gap while both tenants are backlogged; the spans of a
server log give the chunks over HTTP (benchmarks/sched_http_timeline.py)."""

from __future__ import annotations

import json

from benchmarks.sched_http_timeline import marks
from benchmarks.sched_service import max_gap, prompt_events, series


def test_a_prompt_counts_as_its_chunks_are_computed_and_recomputation_counts_nothing():
    # 100 prompt tokens in chunks of 60 and 40; preempted, recomputed 0-100; then its outputs'
    # positions (100-102) are computed again: only the first 100 count, when computed, over weight 2
    chunks = [(1.0, 60, 0), (2.0, 40, 60), (5.0, 100, 0), (6.0, 102, 0)]
    assert prompt_events("b", 2.0, 100, chunks, w_in=1.0) == [(1.0, "b", 30.0), (2.0, "b", 20.0)]
    # a prefix-cache hit starts the first chunk at its end: the cached tokens count with it, as
    # the engine's counters book them (engine/scheduler/vtc_counters.py)
    assert prompt_events("a", 1.0, 50, [(3.0, 18, 32)], w_in=1.0) == [(3.0, "a", 50.0)]


def test_the_gap_is_the_change_of_a_minus_b_while_both_are_backlogged():
    events = [(0.5, "a", 40.0), (1.0, "b", 10.0), (2.0, "a", 30.0), (3.0, "b", 90.0), (4.0, "a", 500.0)]
    times, s = series(events, ["a", "b"])
    assert times == [0.5, 1.0, 2.0, 3.0, 4.0] and s["a"] == [40.0, 40.0, 70.0, 70.0, 570.0]
    assert s["b"] == [0.0, 10.0, 10.0, 100.0, 100.0]
    # a - b is 40 before 0.8, then 30, 60 and -30 (at 3.0): 70 below where it was; a's 500 at 4.0
    # is after the window
    assert max_gap(times, s["a"], s["b"], 0.8, 3.5) == 70.0
    assert max_gap(times, s["a"], s["b"], 0.8, 2.5) == 20.0
    assert max_gap(times, s["a"], s["b"], 5.0, 6.0) == 0.0  # never both backlogged
    # one instant's events (a step's outputs in process) are one point: no gap between them
    times, s = series([(1.0, "a", 50.0), (1.0, "b", 50.0), (2.0, "a", 5.0)], ["a", "b"])
    assert times == [1.0, 2.0] and s["a"] == [50.0, 55.0] and s["b"] == [50.0, 50.0]


def test_the_chunks_of_a_request_come_from_its_prefill_spans():
    trace_id = "0x" + "ab" * 16
    spans = [
        {
            "name": "engine.prefill",
            "context": {"trace_id": trace_id},
            "parent_id": "0x01",
            "start_time": "2026-11-27T10:00:00.000000+00:00",
            "events": [
                {
                    "name": "prefill_chunk",
                    "timestamp": "2026-11-27T10:00:00.250000+00:00",
                    "attributes": {"tokens": 64, "start": 0},
                },
                {
                    "name": "prefill_chunk",
                    "timestamp": "2026-11-27T10:00:00.500000+00:00",
                    "attributes": {"tokens": 20, "start": 64},
                },
            ],
        },
        {
            "name": "engine.request",
            "context": {"trace_id": trace_id},
            "parent_id": "0x01",
            "start_time": "2026-11-27T10:00:00.000000+00:00",
            "attributes": {"fairlane.request_id": "r1"},
            "events": [{"name": "admitted", "timestamp": "2026-11-27T10:00:00.100000+00:00"}],
        },
    ]
    log = "\n".join(json.dumps(span, indent=4) for span in spans).encode()
    m = marks(log)["r1"]
    (t1, n1, s1), (t2, n2, s2) = m["chunks"]
    assert (n1, s1, n2, s2) == (64, 0, 20, 64) and round(t2 - t1, 3) == 0.25
    assert round(t1 - m["admitted"], 3) == 0.15
