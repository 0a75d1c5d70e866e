"""Urgent prompts between the layers of a step in flight, on the worker (gateway/worker/loop.py,
engine/interrupts.py): against real Redis and a tiny random-weight engine, an urgent lane's entry
that arrives while a bulk step runs is taken, prefilled and its first token published before that
step ends; every request's tokens are those of a run without the interruption."""

from __future__ import annotations

import uuid

import pytest
from worker_lanes import results, run_until_done

from engine import SamplingParams
from engine.interrupts import Interrupt
from gateway.lanes.keys import lane_key
from gateway.lanes.messages import LaneRequest
from gateway.worker import loop
from gateway.worker.loop import Worker

TIERS = ["priority", "standard", "batch"]


def _submit(redis, model, tier: str, prompt: list[int]) -> str:
    rid = f"req-{uuid.uuid4().hex[:12]}"
    sampling = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    request = LaneRequest(
        request_id=rid,
        model=model,
        tier=tier,
        tenant="acme",
        prompt_token_ids=tuple(prompt),
        sampling=sampling,
    )
    redis.xadd(lane_key(model, tier), request.encode())
    return rid


def _run(engine, redis, model: str, *, interrupt: bool) -> tuple[list[list[int]], dict]:
    """Four bulk prompts, then an urgent one: mid-step (interrupt) or before the next step."""
    worker = Worker(engine, redis, model=model, tiers=TIERS, worker_id=f"w-{interrupt}", block_ms=10)
    worker.setup()
    bulk = [_submit(redis, model, "batch", [3 + i + j % 7 for j in range(40)]) for i in range(4)]
    worker.run_once()  # takes them; the first step prefills 64 of their 160 tokens
    seen: dict = {}
    urgent = [50 + j for j in range(20)]
    if interrupt:
        assert worker._interrupt is not None
        inner = worker._interrupt

        def poll() -> None:
            if "rid" not in seen:
                seen["rid"] = _submit(redis, model, "priority", urgent)
            inner.poll()

        def deliver(outputs) -> None:
            inner.deliver(outputs)
            seen["published"] = len(results(redis, seen["rid"]))  # on its stream before the step ended

        worker._interrupt = Interrupt(poll=poll, deliver=deliver)
    else:
        seen["rid"] = _submit(redis, model, "priority", urgent)
    worker.run_once()
    rids = [*bulk, seen["rid"]]
    run_until_done(worker, redis, rids)
    tokens = [[t for r in results(redis, rid) for t in r.token_ids] for rid in rids]
    assert engine.num_free_blocks == engine.num_total_blocks
    return tokens, seen


@pytest.mark.parametrize("policy", ["priority", "priority+vtc+slo"])
def test_an_urgent_entry_is_published_before_the_step_in_flight_ends(
    tiny_engine_factory, redis, model_name, monkeypatch, policy
):
    monkeypatch.setattr(loop, "INTERRUPT_POLL_S", 0.0)  # take after every layer
    config = dict(policy=policy, max_num_batched_tokens=64, block_size=8)
    plain = tiny_engine_factory(**config)
    reference, _ = _run(plain, redis, model_name, interrupt=False)
    assert plain.stats.interrupts == 0
    engine = tiny_engine_factory(**config)
    tokens, seen = _run(engine, redis, model_name, interrupt=True)
    assert engine.stats.interrupts == 1 and seen["published"] == 1
    assert tokens == reference and all(len(t) == 6 for t in tokens)


def test_fcfs_takes_no_entry_inside_a_step(tiny_engine_factory, redis, model_name):
    worker = Worker(tiny_engine_factory(), redis, model=model_name, tiers=TIERS, worker_id="w", block_ms=10)
    assert worker._interrupt is None
