"""The worker's side of SLO-aware admission, against real Redis and a tiny random-weight engine:
targets reach the engine, its load is published for the gateways, refusals come back as errors."""

from __future__ import annotations

import time
import uuid

from worker_lanes import results as _results

from engine import SamplingParams, SLOLoad
from gateway.lanes.keys import lane_key, load_key, out_key
from gateway.lanes.messages import LaneRequest, LoadReport
from gateway.worker.loop import Worker

TIERS = ["priority", "standard", "batch"]
# A fixed step-cost prior: an engine that has not stepped predicts with exactly these.
SLOW_PRIOR = dict(cost_step_s=0.01, cost_prefill_token_s=0.0005, cost_decode_seq_s=0.001)


def _submit(redis, model, tier="standard", *, prompt=(5, 6, 7, 8), max_tokens=8, **fields) -> str:
    rid = f"req-{uuid.uuid4().hex[:12]}"
    req = LaneRequest(
        request_id=rid,
        model=model,
        tier=tier,
        tenant="acme",
        prompt_token_ids=tuple(prompt),
        sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
        **fields,
    )
    redis.xadd(lane_key(model, tier), req.encode())
    return rid


def _worker(engine, redis, model, worker_id="w1") -> Worker:
    worker = Worker(engine, redis, model=model, tiers=TIERS, worker_id=worker_id, block_ms=10)
    worker.setup()
    return worker


def _backlog(engine, n=4, prompt_len=200, priority=2) -> None:
    """Requests added straight to the engine (no lane, no target): work ahead of newcomers."""
    for i in range(n):
        engine.add_request(
            f"backlog-{i}",
            [3 + i] * prompt_len,
            SamplingParams(max_tokens=4, ignore_eos=True),
            priority=priority,
        )


def test_targets_of_the_lane_request_reach_the_engine(tiny_engine_factory, redis, model_name):
    engine = tiny_engine_factory(policy="priority+slo")
    worker = _worker(engine, redis, model_name)
    rid = _submit(redis, model_name, max_tokens=50, ttft_target_s=30.0, tpot_target_s=2.5)
    worker.run_once()
    seq = engine.seqs[rid]
    assert (seq.ttft_target_s, seq.tpot_target_s, seq.priority) == (30.0, 2.5, 2)  # standard = 2
    engine.abort(rid)
    redis.delete(out_key(rid))


def test_load_is_published_only_with_an_slo_policy(tiny_engine_factory, redis, model_name):
    plain = _worker(tiny_engine_factory(), redis, model_name, worker_id="plain")
    plain.run_once()
    plain.publish_load(force=True)
    assert redis.hgetall(load_key(model_name)) == {}

    engine = tiny_engine_factory(policy="priority+slo", max_num_batched_tokens=128, **SLOW_PRIOR)
    worker = _worker(engine, redis, model_name, worker_id="slo")
    _backlog(engine)
    worker.publish_load(force=True)
    report = LoadReport.decode(redis.hget(load_key(model_name), "slo"))
    assert report.worker == "slo" and abs(report.at - time.time()) < 5 and report.load == engine.slo_load()
    load = report.load
    assert (load.step_s, load.prefill_token_s, load.decode_seq_s) == (0.01, 0.0005, 0.001)
    assert load.waiting_tokens == {2: 800} and load.running == 0 and load.tiered
    assert (load.max_num_batched_tokens, load.max_num_seqs, load.slot_wait_s) == (128, 16, 0.0)

    worker.run_once()  # a step, too soon after the last publication to publish again
    time.sleep(0.06)
    worker.run_once()  # due: the load goes out with the step's results
    load = LoadReport.decode(redis.hget(load_key(model_name), "slo")).load
    assert load.running > 0 and sum(load.waiting_tokens.values()) < 800

    worker.withdraw_load()
    assert redis.hget(load_key(model_name), "slo") is None


def test_stale_loads_of_dead_workers_are_pruned(tiny_engine_factory, redis, model_name):
    worker = _worker(tiny_engine_factory(policy="slo"), redis, model_name, worker_id="live")
    dead = LoadReport(
        worker="dead",
        at=time.time() - 3600,
        load=SLOLoad(
            step_s=0.01,
            prefill_token_s=0.0,
            decode_seq_s=0.0,
            max_num_batched_tokens=64,
            max_num_seqs=4,
            running=0,
            slot_wait_s=0.0,
        ),
    )
    redis.hset(load_key(model_name), mapping={"dead": dead.encode(), "garbled": "{"})
    worker.publish_load(force=True)
    assert worker.lane_io.prune_loads() == 2
    assert set(redis.hgetall(load_key(model_name))) == {b"live"}


def test_refused_on_arrival_is_an_slo_error_with_retry_after(tiny_engine_factory, redis, model_name):
    engine = tiny_engine_factory(policy="priority+slo", max_num_batched_tokens=128, **SLOW_PRIOR)
    worker = _worker(engine, redis, model_name)
    _backlog(engine)  # 820 tokens ahead: 7 steps of 74 ms = 0.52 s to a first token
    rid = _submit(redis, model_name, prompt=[9] * 20, ttft_target_s=0.1)
    worker.run_once()  # refused on arrival, before the step (the prior cost model still holds)
    (error,) = _results(redis, rid)
    assert error.kind == "error" and error.done and error.error_code == "slo_unattainable"
    assert error.retry_after_s == 1 and "time-to-first-token" in error.error_message
    assert rid not in engine.seqs and rid not in worker.inflight
    assert redis.xlen(lane_key(model_name, "standard")) == 0  # ACKed and deleted
    while engine.has_unfinished():
        engine.step()
    assert engine.num_free_blocks == engine.num_total_blocks
    redis.delete(out_key(rid))


def test_refused_at_a_step_start_is_an_slo_error_and_frees_nothing_twice(
    tiny_engine_factory, redis, model_name
):
    # A near-zero cost prior admits it on arrival; then it waits behind 800 tokens of a higher tier
    # (64 a step) for longer than its target, and the next step start refuses it.
    engine = tiny_engine_factory(
        policy="priority+slo",
        max_num_batched_tokens=64,
        cost_step_s=1e-4,
        cost_prefill_token_s=1e-6,
        cost_decode_seq_s=1e-6,
    )
    worker = _worker(engine, redis, model_name)
    _backlog(engine, priority=3)
    rid = _submit(redis, model_name, prompt=[9] * 20, ttft_target_s=0.5)
    worker.run_once()
    assert rid in worker.inflight and _results(redis, rid) == []
    time.sleep(0.6)
    worker.run_once()
    (error,) = _results(redis, rid)
    assert error.kind == "error" and error.error_code == "slo_unattainable" and error.retry_after_s >= 1
    assert rid not in worker.inflight and redis.xlen(lane_key(model_name, "standard")) == 0
    while engine.has_unfinished():
        engine.step()
    assert engine.num_free_blocks == engine.num_total_blocks
    redis.delete(out_key(rid))


def test_time_in_the_lane_counts_toward_ttft(tiny_engine_factory, redis, model_name):
    engine = tiny_engine_factory(policy="slo", **SLOW_PRIOR)
    worker = _worker(engine, redis, model_name)
    rid = _submit(redis, model_name, ttft_target_s=1.0, enqueued_at=time.time() - 5)  # queued 5 s ago
    worker.run_once()
    (error,) = _results(redis, rid)
    assert error.error_code == "slo_unattainable" and error.retry_after_s >= 4
    redis.delete(out_key(rid))
