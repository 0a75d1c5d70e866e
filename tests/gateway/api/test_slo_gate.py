"""The SLO door check (gateway/api/slo_gate.py): the gateway predicts, from the loads its workers
publish, what the engine itself predicts (one formula, engine/scheduler/load.py), and the
SLOGate's reads of real Redis."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis

from engine import SamplingParams, SLOLoad
from gateway.api.errors import SLOUnattainable
from gateway.api.slo_gate import SLOGate
from gateway.lanes.keys import GROUP, lane_key, load_key
from gateway.lanes.messages import LaneRequest, LoadReport

TIERS = ["priority", "standard", "batch"]  # engine priorities 3, 2, 1


def _load(
    worker="w",
    *,
    step_s=0.01,
    prefill_token_s=0.001,
    decode_seq_s=0.0,
    running=0,
    waiting=None,
    tiered=True,
    at=None,
    budget=64,
) -> LoadReport:
    load = SLOLoad(
        step_s=step_s,
        prefill_token_s=prefill_token_s,
        decode_seq_s=decode_seq_s,
        max_num_batched_tokens=budget,
        max_num_seqs=8,
        running=running,
        slot_wait_s=0.0,
        waiting_tokens=waiting or {},
        tiered=tiered,
    )
    return LoadReport(worker=worker, load=load, at=time.time() if at is None else at)


@pytest.mark.parametrize("policy", ["priority+slo", "slo"])
async def test_the_gate_predicts_what_the_engine_predicts(
    tiny_engine_factory, aredis, redis, model_name, policy
):
    engine = tiny_engine_factory(policy=policy, max_num_seqs=3, max_num_batched_tokens=96)
    for i, (priority, n) in enumerate([(3, 150), (2, 60), (1, 200), (2, 90), (1, 30)]):
        engine.add_request(
            f"r{i}", [5 + i] * n, SamplingParams(max_tokens=20, ignore_eos=True), priority=priority
        )
    for _ in range(6):  # three at the sequence cap, the rest waiting; the cost model has seen real steps
        engine.step()  # (an urgent prompt that would be split beside another starts whole next step)
        if engine.num_running == 3:
            break
    load = engine.slo_load()
    assert load.running == 3 and load.slot_wait_s > 0 and load.waiting_tokens
    redis.hset(
        load_key(model_name), "w", LoadReport(worker="w", load=load).encode()
    )  # as a worker publishes it
    gate = SLOGate(aredis, model=model_name, tiers=TIERS, cache_s=0)
    for tier, priority in zip(TIERS, (3, 2, 1)):
        for prompt_tokens in (1, 40, 97, 250):
            assert await gate.predict(tier, prompt_tokens) == pytest.approx(
                engine.predict_ttft(prompt_tokens, priority), rel=1e-9
            )


@pytest.fixture
async def aredis(redis_url):
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def test_no_live_load_means_no_check(aredis, redis, model_name):
    gate = SLOGate(aredis, model=model_name, tiers=TIERS, cache_s=0)
    assert await gate.predict("standard", 10) is None
    assert await gate.check(tier="standard", prompt_tokens=10, ttft_target_s=1e-9) is None
    redis.hset(load_key(model_name), "old", _load("old", at=time.time() - 60).encode())  # a dead worker's
    assert await gate.predict("standard", 10) is None


async def test_the_best_live_worker_counts_and_the_check_refuses_over_target(aredis, redis, model_name):
    busy = _load("busy", waiting={2: 640})  # 11 steps of 0.074 s for a 10-token prompt
    idle = _load("idle")  # 1 step of 0.02 s
    redis.hset(load_key(model_name), mapping={"busy": busy.encode(), "idle": idle.encode(), "junk": "{"})
    gate = SLOGate(aredis, model=model_name, tiers=TIERS, cache_s=0)
    assert await gate.predict("standard", 10) == pytest.approx(0.02)
    redis.hdel(load_key(model_name), "idle")
    assert await gate.predict("standard", 10) == pytest.approx(11 * 0.074)
    assert await gate.predict("priority", 10) == pytest.approx(0.02)  # a higher tier is not behind it
    assert await gate.check(tier="priority", prompt_tokens=10, ttft_target_s=0.1) == pytest.approx(0.02)
    with pytest.raises(SLOUnattainable) as refused:
        await gate.check(tier="standard", prompt_tokens=10, ttft_target_s=0.1)
    error = refused.value
    assert error.status_code == 503 and error.code == "slo_unattainable"
    assert error.headers["retry-after"] == "1" and "0.1 s" in error.message


async def test_unread_lane_entries_and_this_gateways_queued_prompts_are_ahead(aredis, redis, model_name):
    redis.hset(load_key(model_name), "w", _load("w").encode())
    gate = SLOGate(aredis, model=model_name, tiers=TIERS, cache_s=0)
    assert await gate.predict("standard", 64) == pytest.approx(0.074)  # one full step
    gate.note_queued("standard", 64)  # the mean prompt this gateway has seen: 64
    for tier in ("priority", "standard", "batch"):  # three entries nobody has read
        redis.xgroup_create(lane_key(model_name, tier), GROUP, id="0", mkstream=True)
        req = LaneRequest(
            request_id=f"x-{tier}",
            model=model_name,
            tier=tier,
            tenant="t",
            prompt_token_ids=(1,) * 64,
            sampling=SamplingParams(),
        )
        redis.xadd(lane_key(model_name, tier), req.encode())
    redis.xreadgroup(GROUP, "someone", {lane_key(model_name, "batch"): ">"})  # read: pending, not unread
    # standard: its own lane and the priority lane are ahead (2 x 64 tokens), batch is not
    assert await gate.predict("standard", 64) == pytest.approx(3 * 0.074)
    assert await gate.predict("batch", 64) == pytest.approx(3 * 0.074)  # the batch entry was read

    cached = SLOGate(aredis, model=model_name, tiers=TIERS, cache_s=30)
    cached.note_queued("priority", 64)
    before = await cached.predict("priority", 64)  # reads once; prompts queued since count on top
    cached.note_queued("priority", 64)
    assert await cached.predict("priority", 64) == pytest.approx(before + 0.074)
    redis.hdel(load_key(model_name), "w")
    assert await cached.predict("priority", 64) is not None  # still the cached read


async def test_one_read_per_cache_period_however_many_requests(aredis, redis, model_name):
    redis.hset(load_key(model_name), "w", _load("w").encode())
    gate = SLOGate(aredis, model=model_name, tiers=TIERS, cache_s=0.2)
    first = await gate.snapshot()
    snapshots = await asyncio.gather(*(gate.snapshot() for _ in range(50)))
    assert all(s is first for s in snapshots)
    await asyncio.sleep(0.25)
    assert await gate.snapshot() is not first
