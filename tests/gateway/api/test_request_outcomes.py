"""One test per way a request can end — finished, stopped by the client before and after its first
token, timed out, refused by the SLO door check, its worker lost, its Redis lost — each settled
exactly once: one quota settlement (``fairlane_quota_settlements``), one usage record and one
request log line, with the same status and tokens, and the quota charged exactly those tokens.

An in-process gateway on the real Redis and database of the module; one running worker (tiny
model) shared by the tests that need a healthy one; the others park, stop or cut their own."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid

import pytest
from gateway_test_helpers import (
    InProcessGateway,
    admin_headers,
    inproc_gateway,
    inproc_worker,
    make_tenant_key,
)
from prometheus_client import REGISTRY

from gateway.lanes.keys import cancel_key, lane_key, model_info_key, out_key, workers_key
from gateway.lanes.messages import LaneRequest, LaneResult

SETTLEMENTS = "fairlane_quota_settlements_total"
BUDGET = {"daily_token_budget": 10**6, "requests_per_minute": 1000}


@pytest.fixture(scope="module")
def module_worker(quota_settings, tiny_engine_factory):
    with inproc_worker(tiny_engine_factory(num_threads=None), quota_settings) as (worker, client):
        yield worker
        _forget_model(client, quota_settings.model_name)


def _forget_model(client, model: str) -> None:
    for pattern in (f"lanes:{model}:*", f"workers:{model}", f"model:{model}", f"worker:{model}:*"):
        for key in client.scan_iter(match=pattern, count=1000):
            client.delete(key)


def _own_model(settings, **update):
    """The module's settings for a model of the test's own (its lanes, its workers)."""
    return settings.model_copy(update={"served_model_name": f"test-{uuid.uuid4().hex[:10]}", **update})


class Gateway(InProcessGateway):
    async def tenant(self) -> tuple[int, str]:
        tenant, key = await make_tenant_key(self.http, f"t{uuid.uuid4().hex[:8]}")
        response = await self.http.put(
            f"/admin/tenants/{tenant['id']}/quota", json=BUDGET, headers=admin_headers()
        )
        assert response.status_code == 200, response.text
        return tenant["id"], key


def _settlements() -> dict[tuple[str, str], float]:
    return {
        (s.labels["status"], s.labels["action"]): s.value
        for metric in REGISTRY.collect()
        for s in metric.samples
        if s.name == SETTLEMENTS
    }


@contextlib.contextmanager
def _one_settlement(status: str, action: str):
    """Exactly one quota settlement, ``status`` and ``action`` (charged / refunded), in the block."""
    before = _settlements()
    yield
    after = _settlements()
    grew = {
        label: after[label] - before.get(label, 0.0) for label in after if after[label] != before.get(label)
    }
    assert grew == {(status, action): 1.0}, grew


async def _settled_once(
    gw, caplog, tenant_id: int, *, status: str, prompt: int | None, completion: int | None
):
    """The tenant's one request: one usage record and one request log line that agree, and the quota
    charged exactly their tokens (nothing in flight). ``None``: any token count (checked equal)."""
    for _ in range(100):  # a cancelled request settles after the client has gone
        records = gw.records(tenant_id)
        if records and (await gw.quota_usage(tenant_id))["in_flight"] == 0:
            break
        await asyncio.sleep(0.1)
    (record,) = records
    assert record.status == status
    assert prompt is None or record.prompt_tokens == prompt
    assert completion is None or record.completion_tokens == completion
    lines = [r for r in caplog.records if r.name == "fairlane.request" and r.request_id == record.request_id]
    assert [(r.status, r.prompt_tokens, r.completion_tokens) for r in lines] == [
        (status, record.prompt_tokens, record.completion_tokens)
    ]
    usage = await gw.quota_usage(tenant_id)
    assert usage["in_flight"] == 0
    assert usage["daily"]["used"] == record.prompt_tokens + record.completion_tokens
    return record


@contextlib.asynccontextmanager
async def _over_a_socket(gw):
    """The gateway's app served on a real port (a client can leave, or read a stream as it comes)."""
    import httpx
    import uvicorn
    from serve_process import free_port

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(gw.app, port=port, lifespan="off", log_level="warning"))
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.05)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            yield client
    finally:
        server.should_exit = True
        await serving


async def _stream(client, gw, key: str, *, after_first_token=None, leave: bool = False) -> list[str]:
    """A streamed 240-token completion's data lines; ``after_first_token()`` runs once the first
    token has come through the gateway; ``leave``: the client goes away there."""
    body = {"model": gw.model, "prompt": "abc", "max_tokens": 240, "ignore_eos": True, "stream": True}
    lines = []
    async with client.stream(
        "POST", "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}
    ) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            lines.append(line)
            if len(lines) == 1:
                if leave:
                    break
                if after_first_token is not None:
                    await after_first_token()
    return lines


@pytest.fixture(autouse=True)
def _request_log(caplog):
    caplog.set_level(logging.INFO, logger="fairlane.request")


async def test_finished(quota_settings, module_worker, caplog):
    async with inproc_gateway(quota_settings, Gateway) as gw:
        tenant_id, key = await gw.tenant()
        with _one_settlement("length", "charged"):
            response = await gw.chat(key, max_tokens=5)
            assert response.status_code == 200, response.text
        usage = response.json()["usage"]
        record = await _settled_once(
            gw, caplog, tenant_id, status="length", prompt=usage["prompt_tokens"], completion=5
        )
        assert record.request_id == response.headers["x-request-id"]


async def test_a_stream_ends_before_its_usage_record_is_written(quota_settings, module_worker, caplog):
    """[DONE] and the end of the response do not wait for the usage batch (its linger): the record
    and the log line come after, settled once all the same."""
    settings = quota_settings.model_copy(update={"usage_write_linger_s": 2.0})
    async with inproc_gateway(settings, Gateway) as gw:
        tenant_id, key = await gw.tenant()
        with _one_settlement("length", "charged"):
            async with _over_a_socket(gw) as client:
                body = dict(model=gw.model, prompt="abc", max_tokens=5, ignore_eos=True, stream=True)
                async with client.stream(
                    "POST", "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}
                ) as response:
                    lines = [line async for line in response.aiter_lines() if line.startswith("data: ")]
                assert lines[-1] == "data: [DONE]"
                assert gw.records(tenant_id) == []  # still lingering: the stream did not wait for it
                assert (await gw.quota_usage(tenant_id))["in_flight"] == 0  # settled before [DONE]
                await _settled_once(gw, caplog, tenant_id, status="length", prompt=None, completion=5)


# 0: the client leaves the moment the admission's Lua has queued it, before the gateway has its
# reply (on Python 3.11 redis-py's send, under wait_for, can swallow that cancellation)
@pytest.mark.parametrize("poll_s", [0.01, 0])
async def test_cancelled_before_the_first_token_is_refunded(quota_settings, redis, caplog, poll_s):
    settings = _own_model(quota_settings)
    redis.zadd(workers_key(settings.model_name), {"announced-only": time.time()})  # nobody reads its lane
    try:
        async with inproc_gateway(settings, Gateway) as gw:
            tenant_id, key = await gw.tenant()
            with _one_settlement("cancelled", "refunded"):
                waiting = asyncio.create_task(gw.chat(key))
                while not redis.xlen(lane_key(settings.model_name, "standard")):
                    await asyncio.sleep(poll_s)
                waiting.cancel()
                await asyncio.gather(waiting, return_exceptions=True)
                await _settled_once(gw, caplog, tenant_id, status="cancelled", prompt=0, completion=0)
    finally:
        _forget_model(redis, settings.model_name)


async def test_cancelled_after_the_first_token_is_charged_what_ran(quota_settings, module_worker, caplog):
    async with inproc_gateway(quota_settings, Gateway) as gw:
        tenant_id, key = await gw.tenant()
        with _one_settlement("cancelled", "charged"):
            async with _over_a_socket(gw) as client:
                await _stream(client, gw, key, leave=True)
                record = await _settled_once(
                    gw, caplog, tenant_id, status="cancelled", prompt=None, completion=None
                )
        assert record.prompt_tokens > 0 and 0 < record.completion_tokens < 240


async def test_timed_out_is_refunded(quota_settings, redis, caplog):
    settings = _own_model(quota_settings, request_timeout_s=1, stream_idle_timeout_s=1)
    redis.zadd(workers_key(settings.model_name), {"announced-only": time.time()})  # alive, never answers
    try:
        async with inproc_gateway(settings, Gateway) as gw:
            tenant_id, key = await gw.tenant()
            with _one_settlement("timeout", "refunded"):
                response = await gw.chat(key)
            assert response.status_code == 504 and response.json()["error"]["code"] == "timeout"
            await _settled_once(gw, caplog, tenant_id, status="timeout", prompt=0, completion=0)
    finally:
        _forget_model(redis, settings.model_name)


async def test_refused_by_the_slo_door_check_is_refunded(quota_settings, tiny_engine_factory, redis, caplog):
    import dataclasses

    from engine import SamplingParams
    from gateway.worker.loop import Worker

    settings = _own_model(
        quota_settings,
        engine=dataclasses.replace(quota_settings.engine, policy="priority+slo"),
        tier_ttft_targets={"standard": 0.1},
    )
    engine = tiny_engine_factory(
        policy="priority+slo",
        max_num_batched_tokens=128,
        cost_step_s=0.01,
        cost_prefill_token_s=0.0005,
        cost_decode_seq_s=0.001,
    )
    worker = Worker(engine, redis, model=settings.model_name, tiers=settings.tiers, worker_id="parked")
    worker.setup()
    redis.zadd(workers_key(settings.model_name), {"parked": time.time()})
    redis.hset(model_info_key(settings.model_name), "max_model_len", engine.max_model_len)
    for i in range(4):  # 800 tokens ahead of a newcomer: over its 0.1 s target
        engine.add_request(f"backlog-{i}", [3 + i] * 200, SamplingParams(max_tokens=4), priority=2)
    worker.publish_load(force=True)
    try:
        async with inproc_gateway(settings, Gateway) as gw:
            tenant_id, key = await gw.tenant()
            with _one_settlement("slo_unattainable", "refunded"):
                response = await gw.chat(key)
            assert response.status_code == 503 and response.json()["error"]["code"] == "slo_unattainable"
            await _settled_once(gw, caplog, tenant_id, status="slo_unattainable", prompt=0, completion=0)
    finally:
        redis.delete(f"load:{settings.model_name}")
        _forget_model(redis, settings.model_name)


async def test_worker_lost_mid_stream_is_charged_what_was_relayed(
    quota_settings, tiny_engine_factory, redis, caplog
):
    settings = _own_model(quota_settings, stream_idle_timeout_s=1)
    model = settings.model_name
    try:
        async with inproc_gateway(settings, Gateway) as gw, _over_a_socket(gw) as client:
            tenant_id, key = await gw.tenant()
            with _one_settlement("worker_lost", "charged"):
                with inproc_worker(tiny_engine_factory(num_threads=None), settings) as (_worker, _client):
                    stopped = asyncio.Event()

                    async def lose_the_worker() -> None:
                        stopped.set()
                        await asyncio.sleep(0)

                    streaming = asyncio.create_task(
                        _stream(client, gw, key, after_first_token=lose_the_worker)
                    )
                    await stopped.wait()
                # Its worker stopped mid-request; its last beat ages past WORKER_ALIVE_S at once.
                redis.zadd(workers_key(model), {"inproc": time.time() - 60})
                lines = await streaming
            assert '"code":"worker_lost"' in lines[-2].replace(" ", "") and lines[-1] == "data: [DONE]"
            record = await _settled_once(
                gw, caplog, tenant_id, status="worker_lost", prompt=None, completion=None
            )
            assert 0 < record.completion_tokens < 240 and record.prompt_tokens > 0
    finally:
        _forget_model(redis, model)


async def test_redis_lost_mid_stream_is_charged_what_was_relayed(
    quota_settings, tiny_engine_factory, redis_url, caplog
):
    from gateway.cli.embedded_redis import EmbeddedRedis

    server = EmbeddedRedis()
    process = server.spawn()
    try:  # the lanes on a Redis of their own, killed mid-stream; the quotas stay on the module's
        settings = _own_model(quota_settings, redis_url=server.url, quota_redis_url=redis_url)
        async with inproc_gateway(settings, Gateway) as gw, _over_a_socket(gw) as client:
            tenant_id, key = await gw.tenant()

            async def kill_redis() -> None:
                process.kill()
                await asyncio.to_thread(process.wait)

            with _one_settlement("interrupted", "charged"):
                with inproc_worker(tiny_engine_factory(num_threads=None), settings):
                    lines = await _stream(client, gw, key, after_first_token=kill_redis)
            assert '"code":"interrupted"' in lines[-2].replace(" ", "") and lines[-1] == "data: [DONE]"
            record = await _settled_once(
                gw, caplog, tenant_id, status="interrupted", prompt=None, completion=None
            )
            assert record.completion_tokens > 0 and record.prompt_tokens > 0
    finally:
        process.kill()
        process.wait()
        server.remove()


async def test_a_client_that_leaves_while_its_request_waits_is_refunded_and_it_never_runs(
    quota_settings, tiny_engine_factory, redis, caplog
):
    """Queued behind others (here: nobody reads the lane yet), a request whose client leaves is
    cancelled while it waits for its first result, not once that comes: refunded at once, and the
    worker that takes it later drops it without running it."""
    settings = _own_model(quota_settings)
    model = settings.model_name
    redis.zadd(workers_key(model), {"announced-only": time.time()})
    try:
        async with inproc_gateway(settings, Gateway) as gw, _over_a_socket(gw) as client:
            tenant_id, key = await gw.tenant()
            with _one_settlement("cancelled", "refunded"):
                body = {"model": gw.model, "prompt": "abc", "max_tokens": 5}
                leaving = asyncio.create_task(
                    client.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"})
                )
                while not redis.xlen(lane_key(model, "standard")):
                    await asyncio.sleep(0.01)
                leaving.cancel()  # the connection closes
                await asyncio.gather(leaving, return_exceptions=True)
                await _settled_once(gw, caplog, tenant_id, status="cancelled", prompt=0, completion=0)
            ((_entry_id, fields),) = redis.xrange(lane_key(model, "standard"))
            request_id = LaneRequest.decode(fields).request_id
            assert redis.exists(cancel_key(request_id))
            with inproc_worker(tiny_engine_factory(num_threads=None), settings) as (worker, _client):
                for _ in range(200):
                    if not redis.xlen(lane_key(model, "standard")):
                        break
                    await asyncio.sleep(0.02)
                assert redis.xlen(lane_key(model, "standard")) == 0  # taken and dropped
                assert redis.xlen(out_key(request_id)) == 0 and not worker.engine.has_unfinished()
    finally:
        _forget_model(redis, model)


async def test_a_client_that_leaves_a_request_of_several_prompts_is_charged_what_they_ran(
    quota_settings, tiny_engine_factory, redis, caplog
):
    """Several prompts, one engine sequence at a time: the first prompt runs to its end while the
    last waits for its first token. The client leaves then: the request is cancelled, and charged
    every token its prompts generated, not only the first ones the gateway had read."""
    settings = _own_model(quota_settings)
    model = settings.model_name
    try:
        async with inproc_gateway(settings, Gateway) as gw, _over_a_socket(gw) as client:
            tenant_id, key = await gw.tenant()
            with inproc_worker(tiny_engine_factory(num_threads=None, max_num_seqs=1), settings) as _:
                body = dict(model=gw.model, prompt=["abc", "def", "ghi"], max_tokens=40, ignore_eos=True)
                leaving = asyncio.create_task(
                    client.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"})
                )
                while not redis.xrange(lane_key(model, "standard")):
                    await asyncio.sleep(0.005)
                ((_entry_id, fields), *_) = redis.xrange(lane_key(model, "standard"))
                first_prompt = LaneRequest.decode(fields).request_id
                while not any(  # the first prompt's last token is out
                    LaneResult.decode(f).done for _id, f in redis.xrange(out_key(first_prompt))
                ):
                    await asyncio.sleep(0.005)
                leaving.cancel()
                await asyncio.gather(leaving, return_exceptions=True)
                record = await _settled_once(
                    gw, caplog, tenant_id, status="cancelled", prompt=None, completion=None
                )
    finally:
        _forget_model(redis, model)
    assert record.completion_tokens >= 40 and record.prompt_tokens > 0
