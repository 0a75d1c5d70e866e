"""engine/calibrate.py: the step-cost models start from measured steps, not the configured prior."""

from __future__ import annotations

import time

import pytest

from engine import Engine, SamplingParams, SLOUnattainableError, calibrate
from engine.calibrate import DECODE_STEPS

# A prior 1,000 times too slow for the tiny model: a TTFT target it meets with room to spare is
# predicted unattainable, so an SLO engine fed only such requests would never run a step to learn.
SLOW_PRIOR = dict(cost_step_s=1.0, cost_prefill_token_s=0.01, cost_decode_seq_s=0.5)


def slo_engine(tiny_model_dir, **overrides) -> Engine:
    return Engine(
        model=str(tiny_model_dir),
        dtype="float32",
        block_size=4,
        kv_cache_gib=0.02,
        num_threads=1,
        **{"policy": "slo", **SLOW_PRIOR, **overrides},
    )


def test_a_target_the_prior_refuses_is_admitted_once_calibrated(tiny_model_dir):
    eng = slo_engine(tiny_model_dir)
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    prompt = list(range(2, 66))
    with pytest.raises(SLOUnattainableError):
        eng.add_request("before", prompt, params, ttft_target_s=0.5)
    assert eng.predict_ttft(len(prompt)) > 1.0

    observed = calibrate(eng)
    assert observed == 2 * (1 + DECODE_STEPS)  # each batch's prefill and decodes

    predicted = eng.predict_ttft(len(prompt))
    start = time.perf_counter()
    eng.add_request("after", prompt, params, ttft_target_s=0.5)
    first = None
    while eng.has_unfinished():
        for out in eng.step():
            if first is None and out.new_token_ids:
                first = time.perf_counter() - start
    assert first is not None
    # the fit is at the measured level (the prior put it at over a second)
    assert predicted < 0.1 and predicted < 20 * first + 0.01


def test_calibration_leaves_an_idle_engine_with_no_trace_in_its_counters(tiny_model_dir):
    eng = slo_engine(tiny_model_dir, policy="vtc+slo")
    free = eng.num_free_blocks
    calibrate(eng)
    assert not eng.has_unfinished() and not eng.seqs
    assert eng.stats.steps == 0 and eng.stats.output_tokens == 0 and eng.stats.admissions == 0
    assert eng.num_free_blocks == free  # cached prompt blocks stay evictable: free to allocate
    eng.add_request("first", [3, 4, 5], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
    while eng.has_unfinished():
        eng.step()
    # what a worker's metrics count from its engine's stats: the first request's, not calibration's
    assert (eng.stats.steps, eng.stats.admissions, eng.stats.output_tokens) == (2, 1, 2)
    assert eng.stats.prefix_hit_tokens == 0
    # every term of both fits moved off the prior to this machine's scale
    for theta in (eng.scheduler.step_cost.theta, eng.scheduler.policy.cost.theta):
        assert theta[0] < 0.1 * SLOW_PRIOR["cost_step_s"]
        prior_prefill = SLOW_PRIOR["cost_step_s"] + 128 * SLOW_PRIOR["cost_prefill_token_s"]
        assert theta[0] + 128 * theta[1] < 0.1 * prior_prefill


def test_the_warm_up_round_is_not_observed(tiny_model_dir):
    eng = slo_engine(tiny_model_dir)
    seen = []
    observe = eng.scheduler.step_cost.observe
    eng.scheduler.step_cost.observe = lambda *args: (seen.append(args), observe(*args))  # type: ignore[method-assign]
    calibrate(eng)
    assert len(seen) == 2 * (1 + DECODE_STEPS)  # the second round's steps only
    assert eng.scheduler.observing


def test_a_busy_engine_is_not_calibrated(tiny_model_dir):
    eng = slo_engine(tiny_model_dir, policy="fcfs")
    eng.add_request("busy", [3, 4, 5], SamplingParams(max_tokens=2, temperature=0))
    with pytest.raises(RuntimeError, match="idle"):
        calibrate(eng)


def test_a_short_context_takes_a_shorter_long_prompt(tiny_model_dir):
    eng = slo_engine(tiny_model_dir, max_model_len=24, max_num_seqs=2, policy="fcfs")
    assert calibrate(eng) == 2 * (1 + DECODE_STEPS)
