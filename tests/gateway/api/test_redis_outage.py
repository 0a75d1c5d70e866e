"""A Redis outage under load, in process: a server of our own (the embedded Valkey) killed during
4 streams and started again 3 s later, empty. The worker outlives it, every cut stream ends with
an ``interrupted`` error event, its usage is written, its request is cancelled (KV blocks freed)
and service resumes by itself."""

from __future__ import annotations

import asyncio
import json
import time

from gateway_test_helpers import inproc_gateway, inproc_worker, make_tenant_key

from gateway.cli.embedded_redis import EmbeddedRedis

MAX_TOKENS = 240  # long enough to be running when Redis goes (the tiny model: 256 positions)


def _events(text: str) -> list:
    lines = [line[len("data: ") :] for line in text.split("\n\n") if line.startswith("data: ")]
    assert lines[-1] == "[DONE]", text[-300:]
    return [json.loads(line) for line in lines[:-1]]


async def test_streams_cut_by_a_redis_outage_end_with_an_error_and_usage(settings, tiny_engine_factory):
    server = EmbeddedRedis()
    process = server.spawn()
    try:
        own = settings.model_copy(update={"redis_url": server.url})
        engine = tiny_engine_factory(num_threads=None)
        with inproc_worker(engine, own) as (worker, _client):
            async with inproc_gateway(own) as gw:
                tenant, key = await make_tenant_key(gw.http, "outage")
                tasks = [
                    asyncio.create_task(gw.complete(key, f"p{i}", max_tokens=MAX_TOKENS, stream=True))
                    for i in range(4)
                ]
                deadline = time.monotonic() + 30
                while len(worker.inflight) < 4 and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                assert len(worker.inflight) == 4
                process.kill()
                process.wait()
                await asyncio.sleep(3)  # longer than every client's retries
                process = server.spawn()  # the same port, empty
                responses = await asyncio.gather(*tasks)
                for response in responses:  # cut mid-stream, or (no token relayed yet) a 503
                    error = (_events(response.text)[-1] if response.status_code == 200 else response.json())[
                        "error"
                    ]
                    assert response.status_code in (200, 503) and error["type"] == "server_error"
                    assert error["code"] == "interrupted"
                records = {r.request_id: r for r in gw.records(tenant["id"])}
                assert {records[r.headers["x-request-id"]].status for r in responses} == {"interrupted"}

                deadline = time.monotonic() + 10  # service resumes without a hand on it
                while (again := await gw.complete(key, "again")).status_code == 503:
                    assert time.monotonic() < deadline, again.text
                    await asyncio.sleep(0.2)
                assert again.status_code == 200, again.text
                deadline = time.monotonic() + 10  # the cut requests were cancelled: every block free
                while engine.num_free_blocks != engine.num_total_blocks and time.monotonic() < deadline:
                    await asyncio.sleep(0.1)
                assert engine.num_free_blocks == engine.num_total_blocks and worker.inflight == {}
                usage = await gw.quota_usage(tenant["id"])
                assert usage["in_flight"] == 0
    finally:
        process.kill()
        process.wait()
        server.remove()
