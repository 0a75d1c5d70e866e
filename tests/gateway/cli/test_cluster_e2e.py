"""Two gateway processes and two worker processes on one Redis (tiny random-weight model):
120 concurrent streams from 3 tenants each complete exactly once, a worker SIGKILLed mid-stream
loses nothing and every stream still equals the undisturbed greedy answer."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import uuid

import httpx
import openai
import pytest
import redis as redislib
from gateway_test_helpers import ADMIN_TOKEN
from serve_process import free_port, start, wait_ready
from sqlalchemy import func, select

from benchmarks.common import PEAKED_DUMMY_CONFIG
from gateway.lanes.keys import GROUP, lane_key, out_key
from gateway.lanes.messages import LaneRequest
from tenancy import UsageRecord, make_engine, make_session_factory

PROMPTS = [f"prompt number {i}: tell me something" for i in range(8)]
MAX_TOKENS = 48
STEPS_LEFT = 12  # a worker is killed while its requests have this many steps to go, at least
WORKERS = ("worker-a", "worker-b")
STREAMS = 120  # concurrent streams, a multiple of the 3 tenants


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, redis_url):
    tmp = tmp_path_factory.mktemp("cluster")
    model = f"test-{uuid.uuid4().hex[:10]}"
    database_url = f"sqlite:///{tmp / 'fairlane.db'}"
    env = {
        "FAIRLANE_REDIS_URL": redis_url,
        "FAIRLANE_DATABASE_URL": database_url,
        "FAIRLANE_ENGINE__MODEL": "dummy",
        "FAIRLANE_SERVED_MODEL_NAME": model,
        "FAIRLANE_ENGINE__DUMMY_CONFIG": json.dumps(PEAKED_DUMMY_CONFIG),
        "FAIRLANE_ADMIN_TOKEN": ADMIN_TOKEN,
        "FAIRLANE_ENGINE__NUM_THREADS": "1",
        "FAIRLANE_ENGINE__DTYPE": "float32",
        "FAIRLANE_ENGINE__NUM_KV_BLOCKS": "256",
        "FAIRLANE_ENGINE__MAX_NUM_SEQS": "48",
        "FAIRLANE_WORKER_CLAIM_IDLE_MS": "1500",
        "FAIRLANE_CONFIG": "",
        "FAIRLANE_QUOTA_KEY_PREFIX": f"fairlane:quota:{model}",
    }  # tenant ids repeat across test databases
    procs = {}
    try:
        for name in ("worker-a", "worker-b"):
            procs[name] = start(
                ["worker"],
                {
                    **env,
                    "FAIRLANE_WORKER_ID": name,  # one /metrics port each
                    "FAIRLANE_WORKER_METRICS_PORT": str(free_port()),
                },
                str(tmp / f"{name}.log"),
            )
        for name in ("gateway-1", "gateway-2"):
            port = free_port()
            procs[name] = start(
                ["serve", "--workers", "0", "--port", str(port)], env, str(tmp / f"{name}.log"), port=port
            )
        for name in ("gateway-1", "gateway-2"):
            wait_ready(procs[name], timeout_s=300)
        yield {"procs": procs, "model": model, "database_url": database_url}
    finally:
        for served in procs.values():
            served.stop()
        client = redislib.Redis.from_url(redis_url)
        for key in client.scan_iter(match=f"*{model}*", count=1000):
            client.delete(key)
        client.close()


def _admin(served, method, path, **kw):
    response = httpx.request(
        method, served.base_url + path, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30, **kw
    )
    assert response.status_code < 300, response.text
    return response.json()


def _tenant_key(served, name: str) -> str:
    tenant = _admin(served, "POST", "/admin/tenants", json={"name": name, "weight": 1.0})
    return _admin(served, "POST", f"/admin/tenants/{tenant['id']}/keys", json={})["key"]


async def _stream(client, model, prompt, rid_box: list) -> str:
    stream = await client.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    parts = []
    async for chunk in stream:
        rid_box.append(chunk.id)
        parts.append(chunk.choices[0].text)
    return "".join(parts)


def _answering(client: redislib.Redis, lane: str) -> dict[str, int]:
    """Per worker, the requests it holds (pending lane entries) that have published some of their
    results (one entry a step) and have STEPS_LEFT steps to go at least. Three pipelined round trips
    for both workers."""
    pending = [
        (worker, p["message_id"])
        for worker in WORKERS
        for p in client.xpending_range(lane, GROUP, "-", "+", 500, consumername=worker)
    ]
    pipe = client.pipeline(transaction=False)
    for _worker, entry_id in pending:
        pipe.xrange(lane, entry_id, entry_id)
    entries = pipe.execute()
    pipe = client.pipeline(transaction=False)
    held = [(worker, entry) for (worker, _id), entry in zip(pending, entries) if entry]
    for _worker, entry in held:
        pipe.xlen(out_key(LaneRequest.decode(entry[0][1]).request_id))
    lengths = pipe.execute()
    out = dict.fromkeys(WORKERS, 0)
    for (worker, _entry), n in zip(held, lengths):
        out[worker] += 0 < n <= MAX_TOKENS - STEPS_LEFT
    return out


def _kill_one_mid_answer(redis_url: str, lane: str, procs: dict, timeout_s: float) -> str:
    """SIGKILL the first worker seen holding 10 requests mid-answer (which worker takes the most of
    a burst is a race); its name. Watched on the lane, not on the clients, whose relayed streams
    may lag behind a fast engine, from a thread of its own, so that the test's event loop, busy
    with the streams, does not space the polls out: a burst's requests run in lockstep and a fast
    engine ends them all within a second. The kill follows the poll at once and each request seen
    has a dozen steps to go, so the worker dies holding unfinished work for the other to claim."""
    watch = redislib.Redis.from_url(redis_url)
    deadline, most = time.monotonic() + timeout_s, dict.fromkeys(WORKERS, 0)
    try:
        while True:
            held = _answering(watch, lane)
            victim = max(held, key=lambda name: held[name])
            if held[victim] >= 10:
                os.kill(procs[victim].process.pid, signal.SIGKILL)
                return victim
            most = {name: max(n, most[name]) for name, n in held.items()}
            assert time.monotonic() < deadline, f"no worker held 10 requests mid-answer (most seen: {most})"
            time.sleep(0.002)
    finally:
        watch.close()


async def test_120_streams_3_tenants_with_a_worker_killed_mid_stream(cluster, redis_url):
    procs, model = cluster["procs"], cluster["model"]
    gateways = [procs["gateway-1"], procs["gateway-2"]]
    keys = [_tenant_key(gateways[0], f"tenant-{i}") for i in range(3)]
    clients = [
        openai.AsyncOpenAI(base_url=g.base_url + "/v1", api_key=k, max_retries=0, timeout=300)
        for g in gateways
        for k in keys
    ]
    # The undisturbed greedy answers, one request at a time.
    reference = {}
    for prompt in PROMPTS:
        reference[prompt] = await _stream(clients[0], model, prompt, [])
        assert reference[prompt].count(" t") == MAX_TOKENS
    rids: list[list[str]] = [[] for _ in range(STREAMS)]
    jobs = [
        asyncio.create_task(_stream(clients[i % len(clients)], model, PROMPTS[i % len(PROMPTS)], rids[i]))
        for i in range(STREAMS)
    ]
    lane = lane_key(model, "standard")
    victim = await asyncio.to_thread(_kill_one_mid_answer, redis_url, lane, procs, 120)
    survivor = "worker-b" if victim == "worker-a" else "worker-a"
    texts = await asyncio.wait_for(asyncio.gather(*jobs), timeout=300)
    for i, text in enumerate(texts):
        assert text == reference[PROMPTS[i % len(PROMPTS)]], f"stream {i} differs"
    # its log line may land after the streams end (the worker logs from its own thread): wait for it
    claimed_by = time.monotonic() + 15
    while "claims" not in procs[survivor].log() and time.monotonic() < claimed_by:
        await asyncio.sleep(0.1)
    assert "claims" in procs[survivor].log(), "the surviving worker claimed nothing"
    for name in WORKERS:  # each fitted its step costs before taking requests (engine/calibrate.py)
        assert "step cost: " in procs[name].log(), procs[name].log()[-2000:]
    request_ids = {box[0].split("-", 1)[1] for box in rids}
    assert len(request_ids) == STREAMS
    # each gateway writes a stream's usage record after its last chunk (a response's background
    # task, batched with the others that end then): the streams can end before the last batch commits
    engine = make_engine(cluster["database_url"])
    recorded_by = time.monotonic() + 30
    while True:
        with make_session_factory(engine)() as session:
            rows = session.execute(
                select(UsageRecord.request_id, UsageRecord.completion_tokens, UsageRecord.status).where(
                    UsageRecord.request_id.in_(request_ids)
                )
            ).all()
            per_tenant = session.execute(
                select(UsageRecord.tenant_id, func.count())
                .group_by(UsageRecord.tenant_id)
                .where(UsageRecord.request_id.in_(request_ids))
            ).all()
        if len(rows) >= STREAMS or time.monotonic() > recorded_by:
            break
        await asyncio.sleep(0.2)
    engine.dispose()
    assert len(rows) == STREAMS and {r.completion_tokens for r in rows} == {MAX_TOKENS}
    assert {r.status for r in rows} == {"length"}
    assert sorted(n for _t, n in per_tenant) == [STREAMS // 3] * 3
    for client in clients:
        await client.close()
