"""`fairlane serve` stopped while requests are still running past its drain: each cut request is
answered in OpenAI's shape and every one gets its usage record."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import httpx
import redis.asyncio
from serve_process import free_port, start, tiny_serve_env, usage_by_request, wait_ready

from gateway.lanes.keys import lane_key

MAX_TOKENS = 400


def _serve_one_at_a_time(tmp_path):
    """serve with one sequence at a time (the rest wait in line) and a 0.5 s drain."""
    port = free_port()
    env = {
        **tiny_serve_env(tmp_path),
        "FAIRLANE_DRAIN_TIMEOUT_S": "0.5",
        "FAIRLANE_ENGINE__MAX_NUM_SEQS": "1",
    }
    return wait_ready(start(["serve", "--dev", "--port", str(port)], env, str(tmp_path / "s.log"), port=port))


async def _queued(served, count: int, timeout_s: float = 30) -> None:
    """Wait until the standard lane holds ``count`` entries (each request admitted and queued)."""
    client = redis.asyncio.Redis.from_url(served.extra["redis_url"])
    try:
        deadline = time.monotonic() + timeout_s
        while await client.xlen(lane_key("dummy", "standard")) < count:
            assert time.monotonic() < deadline, f"fewer than {count} requests were queued"
            await asyncio.sleep(0.005)
    finally:
        await client.aclose()


async def test_requests_cancelled_when_the_drain_times_out_are_recorded(tmp_path):
    """SIGTERM with 40 streams queued behind one running sequence and a 0.5 s drain: uvicorn cancels
    the requests still running and closes the app at once; each settles (shielded) as it closes.
    Their usage records were lost (the usage writer closed first, then was cancelled with them)."""
    served = _serve_one_at_a_time(tmp_path)
    try:
        body = {"model": "dummy", "prompt": "p", "max_tokens": MAX_TOKENS, "stream": True, "ignore_eos": True}
        headers = {"Authorization": f"Bearer {served.api_key}"}

        async def one(http: httpx.AsyncClient) -> str:
            """How the stream ended: [DONE], or the error it was told (a 503, or its last event)."""
            async with http.stream("POST", "/v1/completions", json=body, headers=headers) as r:
                if r.status_code != 200:
                    return json.loads(await r.aread())["error"]["code"]
                events = [
                    line.removeprefix("data: ") async for line in r.aiter_lines() if line.startswith("data: ")
                ]
            return events[-1] if events[-1] == "[DONE]" else json.loads(events[-1])["error"]["code"]

        async with httpx.AsyncClient(base_url=served.base_url, timeout=60) as http:
            tasks = [asyncio.create_task(one(http)) for _ in range(40)]
            await asyncio.sleep(1.0)
            os.kill(served.process.pid, signal.SIGTERM)
            ends = await asyncio.gather(*tasks)
        assert served.process.wait(timeout=60) == 0
        assert set(ends) <= {"[DONE]", "server_shutting_down"} and "server_shutting_down" in ends, ends
        assert "Exception in ASGI application" not in served.log()
        finished = [json.loads(line) for line in served.log().splitlines() if '"request finished"' in line]
        cancelled = {f["request_id"] for f in finished if f["status"] == "cancelled"}
        assert cancelled, "no request was cancelled at the drain's end: make them longer"
        records = usage_by_request(tmp_path)
        assert {r for r in cancelled if r in records} == cancelled  # every one recorded
        assert all(records[r].status == "cancelled" for r in cancelled)
    finally:
        served.stop()


async def test_plain_requests_cancelled_when_the_drain_times_out_are_recorded(tmp_path):
    """Non-streamed requests queued behind one running sequence when the drain runs out: their
    settlement ran (shielded) but their usage record waited for a response that was never sent
    (uvicorn answers a 500 for a cancelled request): no record, no 'request finished' line."""
    served = _serve_one_at_a_time(tmp_path)
    try:
        body = {"model": "dummy", "prompt": "p", "max_tokens": MAX_TOKENS, "ignore_eos": True}
        headers = {"Authorization": f"Bearer {served.api_key}"}
        async with httpx.AsyncClient(base_url=served.base_url, timeout=60) as http:
            post = lambda: http.post("/v1/completions", json=body, headers=headers)  # noqa: E731
            tasks = [asyncio.create_task(post()) for _ in range(16)]
            await _queued(served, 16)  # every one admitted (on a slow machine 1 s was not enough)
            os.kill(served.process.pid, signal.SIGTERM)
            responses = await asyncio.gather(*tasks, return_exceptions=True)
        assert served.process.wait(timeout=60) == 0
        ok = [r for r in responses if isinstance(r, httpx.Response) and r.status_code == 200]
        ids = {r.headers["x-request-id"] for r in ok}
        cut = [r for r in responses if r not in ok]
        assert cut, "every request finished in the drain: make them longer"
        for r in cut:  # each told in OpenAI's shape (it was uvicorn's plain-text 500 and a traceback)
            assert isinstance(r, httpx.Response) and r.status_code == 503, r
            assert r.json()["error"]["code"] == "server_shutting_down" and r.headers["retry-after"] == "1"
            ids.add(r.headers["x-request-id"])
        assert "Exception in ASGI application" not in served.log()
        records = usage_by_request(tmp_path)
        finished = [json.loads(line) for line in served.log().splitlines() if '"request finished"' in line]
        assert len(records) == len(finished) == 16, (len(records), len(finished))
        assert sum(r.status == "cancelled" for r in records.values()) == len(cut)
        assert ids == set(records)
    finally:
        served.stop()
