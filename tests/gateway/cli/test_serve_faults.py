"""`fairlane serve` as a user runs it, under faults: its engine worker SIGKILLed during 8 streams,
its embedded Redis SIGKILLed during 8 streams, SIGTERM during 8 streams, a worker that cannot load
its model; and requests one at a time on the restarted processes (early starts, result echoes and
the quota settled before the next admission). Refusals to start: test_serve_refusals.py.

serve runs with its defaults (one worker, embedded Redis, the settings' claim and restart times);
only the model is a tiny random-weight one (FAIRLANE_ENGINE__*), with peaked logits so that
greedy answers do not depend on the batch a request runs in.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import time

import httpx
import pytest
import redis.asyncio
from serve_process import (
    free_port,
    metric_by,
    start,
    tiny_serve_env,
    usage_by_request,
    wait_ready,
)

from benchmarks.common import tiny_model
from gateway.lanes.keys import GROUP, lane_key

PROMPTS = [f"stream {i}: tell me a long story" for i in range(8)]
MAX_TOKENS = 400


def _serve(tmp, name: str):
    port = free_port()
    served = start(
        ["serve", "--dev", "--port", str(port)], tiny_serve_env(tmp), str(tmp / f"{name}.log"), port=port
    )
    return wait_ready(served, timeout_s=300)


def _processes(served) -> dict:
    return httpx.get(served.base_url + "/ready", timeout=10).json()["processes"]


async def _stream(http: httpx.AsyncClient, key: str, prompt: str, progress: list, index: int) -> dict:
    """One streamed completion, parsed by hand: its text, finish reason, error event, request id."""
    body = {
        "model": "dummy",
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }
    out = {"text": "", "finish": None, "error": None, "done": False, "keepalives": 0}
    async with http.stream(
        "POST", "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}
    ) as r:
        assert r.status_code == 200, await r.aread()
        out["request_id"] = r.headers["x-request-id"]
        async for line in r.aiter_lines():
            if line.startswith(":"):
                out["keepalives"] += 1
            if not line.startswith("data: "):
                continue
            data = line[len("data: ") :]
            if data == "[DONE]":
                out["done"] = True
                continue
            chunk = json.loads(data)
            if "error" in chunk:
                out["error"] = chunk["error"]
                continue
            choice = chunk["choices"][0]
            out["text"] += choice["text"]
            out["finish"] = choice["finish_reason"] or out["finish"]
            progress[index] += 1
    return out


async def _streams(served, *, during=None) -> list[dict]:
    """8 concurrent streams; ``during()`` runs once every stream has received a chunk."""
    progress = [0] * len(PROMPTS)
    async with httpx.AsyncClient(base_url=served.base_url, timeout=120) as http:
        tasks = [
            asyncio.create_task(_stream(http, served.api_key, p, progress, i)) for i, p in enumerate(PROMPTS)
        ]
        if during is not None:
            while not all(progress) and not any(t.done() for t in tasks):
                await asyncio.sleep(0.01)
            assert not any(t.done() for t in tasks), "the streams ended before the fault: make them longer"
            await asyncio.to_thread(during)
        return await asyncio.gather(*tasks)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve-faults")
    served = _serve(tmp, "serve")
    served.extra["tmp"] = tmp
    try:
        yield served
    finally:
        served.stop()


async def test_a_worker_killed_during_8_streams_is_restarted_and_every_stream_resumes(served):
    reference = await _streams(served)
    assert all(r["finish"] == "length" and r["done"] and r["error"] is None for r in reference)
    worker = _processes(served)["worker-0"]
    killed_at: list[float] = []

    def kill() -> None:
        os.kill(worker["pid"], signal.SIGKILL)
        killed_at.append(time.monotonic())

    disturbed = await _streams(served, during=kill)
    took = time.monotonic() - killed_at[0]
    assert [r["text"] for r in disturbed] == [r["text"] for r in reference]  # nothing lost, nothing repeated
    assert all(r["finish"] == "length" and r["done"] and r["error"] is None for r in disturbed)
    assert took < 30, f"the streams finished {took:.1f} s after the kill"
    after = _processes(served)["worker-0"]
    assert after["restarts"] == worker["restarts"] + 1 and after["last_exit"] == -signal.SIGKILL
    assert after["pid"] != worker["pid"] and after["state"] == "running"
    assert "worker-0 exited with code -9; restarting" in served.log()
    records = usage_by_request(served.extra["tmp"])
    assert all(records[r["request_id"]].completion_tokens == MAX_TOKENS for r in disturbed)


async def _taken_by_worker(served, count: int, timeout_s: float = 30) -> None:
    """Wait until the standard lane's consumer group has ``count`` entries pending (taken by the
    worker, not yet done)."""
    client = redis.asyncio.Redis.from_url(served.extra["redis_url"])
    try:
        deadline = time.monotonic() + timeout_s
        while (await client.xpending(lane_key("dummy", "standard"), GROUP))["pending"] < count:
            assert time.monotonic() < deadline, "the worker did not take both requests"
            await asyncio.sleep(0.005)
    finally:
        await client.aclose()


async def test_a_worker_killed_during_n_gt_1_requests_ends_them_with_a_503_worker_lost(served):
    """The engine resumes one sequence, not n choices: an n = 2 request its worker died in was a
    400 invalid_request ("resume_token_ids cannot continue an n > 1 request"), the client's fault."""
    headers = {"Authorization": f"Bearer {served.api_key}"}
    body = {"model": "dummy", "prompt": "two", "max_tokens": MAX_TOKENS, "ignore_eos": True, "n": 2}
    worker = _processes(served)["worker-0"]
    async with httpx.AsyncClient(base_url=served.base_url, timeout=120) as http:
        plain = asyncio.create_task(http.post("/v1/completions", json=body, headers=headers))
        streamed = {"events": [], "status": None}
        async with http.stream(
            "POST", "/v1/completions", json={**body, "stream": True}, headers=headers
        ) as r:
            streamed["status"], streamed["request_id"] = r.status_code, r.headers["x-request-id"]
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    streamed["events"].append(line[len("data: ") :])
                    if len(streamed["events"]) == 10:
                        # Both requests in the worker's engine (its pending entries), not the plain
                        # one still in the lane: a slow host admits it after the stream's 10 events.
                        await _taken_by_worker(served, 2)
                        os.kill(worker["pid"], signal.SIGKILL)
        response = await plain
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "worker_lost" and response.headers["retry-after"]
    assert streamed["status"] == 200 and streamed["events"][-1] == "[DONE]"
    error = json.loads(streamed["events"][-2])["error"]
    assert error["code"] == "worker_lost" and error["type"] == "server_error", error
    records = usage_by_request(served.extra["tmp"])
    assert records[streamed["request_id"]].status == "worker_lost"
    assert records[response.headers["x-request-id"]].status == "worker_lost"
    deadline = time.monotonic() + 30
    while _processes(served)["worker-0"]["state"] != "running":
        assert time.monotonic() < deadline
        time.sleep(0.1)


async def test_redis_killed_during_8_streams_is_restarted_and_service_resumes(served):
    redis = _processes(served)["redis"]
    results = await _streams(served, during=lambda: os.kill(redis["pid"], signal.SIGKILL))
    for r in results:  # every stream ends: complete, or cut with an error event; never silently
        assert r["done"], r
        assert (r["finish"] == "length" and r["error"] is None) or r["error"]["code"] == "interrupted", r
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        state = _processes(served)["redis"]
        if state["restarts"] == redis["restarts"] + 1 and state["state"] == "running":
            break
        time.sleep(0.05)
    back = time.monotonic()
    headers = {"Authorization": f"Bearer {served.api_key}"}
    body = {"model": "dummy", "prompt": "again", "max_tokens": 4, "temperature": 0}
    while True:  # service answers again within 10 s of Redis returning
        response = httpx.post(served.base_url + "/v1/completions", json=body, headers=headers, timeout=30)
        if response.status_code == 200:
            break
        assert response.status_code == 503, response.text
        assert time.monotonic() - back < 10, f"no service 10 s after Redis returned: {response.text}"
        time.sleep(0.2)
    records = usage_by_request(served.extra["tmp"])
    for r in results:  # usage written for every request, cut ones marked interrupted
        record = records[r["request_id"]]
        assert record.status == ("interrupted" if r["error"] else "length"), (record.status, r)
    assert "redis exited with code -9; restarting" in served.log()


def _early_starts(served) -> dict[str, float]:
    """fairlane_lane_early_starts_total by outcome, summed over workers (serve's /metrics)."""
    return {"bound": 0.0, "dropped": 0.0, **metric_by(served, "fairlane_lane_early_starts_total", "outcome")}


async def test_requests_one_at_a_time_start_early_on_the_restarted_worker(served):
    """serve's default, after the worker and Redis restarts above (the gateway learns the new
    worker's inbox by itself): a request alone starts on the gateway's hint before its lane entry
    comes, none is dropped, and the answers are the greedy ones every time (the early path's tokens
    against the engine's own are checked in tests/gateway/worker/test_worker_early_start.py)."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=served.base_url + "/v1", api_key=served.api_key, max_retries=0)
    ask = dict(
        model="dummy", prompt="early or not", max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
    )
    await client.completions.create(**ask)  # the gateway sees the worker (and its inbox) again
    await asyncio.sleep(1.2)
    before = _early_starts(served)
    answers = [await client.completions.create(**ask) for _ in range(6)]
    started = _early_starts(served)
    assert started["bound"] - before["bound"] >= 5 and started["dropped"] == before["dropped"], (
        before,
        started,
    )
    assert len({a.choices[0].text for a in answers}) == 1
    assert all(a.usage.completion_tokens == 12 and a.choices[0].finish_reason == "length" for a in answers)
    await client.close()


async def test_results_come_back_as_echoes_and_settle_before_the_next_admission(served):
    """serve's default: a request alone gets its last result from the worker's echo (the Redis copy
    comes after), and the next request of a tenant limited to one request at a time, sent as soon as
    the answer is in, is admitted every time: its admission waited for the settlement that rode with
    the echoed result's Redis copy. What was charged is what the usage records say."""
    from openai import AsyncOpenAI

    admin = {"Authorization": f"Bearer {served.admin_token}"}
    async with httpx.AsyncClient(base_url=served.base_url, headers=admin, timeout=30) as http:
        tenant = (await http.post("/admin/tenants", json={"name": f"solo-{os.getpid()}"})).json()
        quota = {"max_concurrency": 1, "daily_token_budget": 10**6}
        assert (await http.put(f"/admin/tenants/{tenant['id']}/quota", json=quota)).status_code == 200
        key = (await http.post(f"/admin/tenants/{tenant['id']}/keys", json={"name": "k"})).json()["key"]
        client = AsyncOpenAI(base_url=served.base_url + "/v1", api_key=key, max_retries=0)
        ask = dict(model="dummy", prompt="one at a time", max_tokens=3, temperature=0)
        await client.completions.create(**ask)  # the gateway sees the worker and its inbox
        await asyncio.sleep(1.2)
        before = metric_by(served, "fairlane_relay_results_total", "source").get("echo", 0.0)
        answers = [await client.completions.create(**ask) for _ in range(20)]  # no 429: none raised
        after = metric_by(served, "fairlane_relay_results_total", "source")["echo"]
        await client.close()
        await asyncio.sleep(0.5)  # the last usage records' batch
        usage = (await http.get(f"/admin/tenants/{tenant['id']}/quota/usage")).json()
    assert all(a.usage.completion_tokens == 3 for a in answers)
    assert after - before >= 15, (before, after)  # the last result of most of them echoed
    records = [r for r in usage_by_request(served.extra["tmp"]).values() if r.tenant_id == tenant["id"]]
    assert len(records) == 21 and usage["in_flight"] == 0
    assert usage["daily"]["used"] == sum(r.prompt_tokens + r.completion_tokens for r in records)


async def test_sigterm_during_8_streams_drains_them_and_stops_everything(tmp_path):
    served = _serve(tmp_path, "sigterm")
    try:
        children = {name: p["pid"] for name, p in _processes(served).items()}
        redis_folder = os.readlink(f"/proc/{children['redis']}/cwd")
        assert os.path.isdir(redis_folder)
        results = await _streams(served, during=lambda: os.kill(served.process.pid, signal.SIGTERM))
        assert all(r["finish"] == "length" and r["done"] and r["error"] is None for r in results)  # drained
        assert served.process.wait(timeout=60) == 0
        for name, pid in children.items():
            assert not _alive(pid), f"{name} (pid {pid}) outlived fairlane serve"
        assert not os.path.exists(redis_folder)
        log = served.log()
        assert "Traceback" not in log and "stopped" in log
    finally:
        served.stop()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def test_a_worker_that_cannot_load_its_model_crash_loops_saying_why_in_one_line(tmp_path):
    """Weights damaged under a running serve: each restart of the worker printed a 25-line
    traceback; now one line naming the model, and /ready a 503 with the crash loop. A request
    admitted as the worker died ends worker_lost after the idle timeout, not the request timeout."""
    folder = tmp_path / "model"
    shutil.copytree(tiny_model(), folder)
    port = free_port()
    env = {
        **tiny_serve_env(tmp_path),
        "FAIRLANE_ENGINE__MODEL": str(folder),
        "FAIRLANE_STREAM_IDLE_TIMEOUT_S": "3",
        "FAIRLANE_RESTART_BACKOFF_S": "0.2",  # the crash loop within a second of backoffs, not 3
    }
    served = wait_ready(
        start(["serve", "--dev", "--port", str(port)], env, str(tmp_path / "s.log"), port=port)
    )
    try:
        with open(folder / "model.safetensors", "r+b") as f:
            f.write(b"\xff" * 8)
        os.kill(_processes(served)["worker-0"]["pid"], signal.SIGKILL)
        # admitted (the worker beat a moment ago), then nobody to run it: it waited the request
        # timeout (600 s); it ends once the idle timeout finds no live worker
        began = time.monotonic()
        body = {"model": folder.name, "prompt": "anyone?", "max_tokens": 4}
        headers = {"Authorization": f"Bearer {served.api_key}"}
        response = httpx.post(served.base_url + "/v1/completions", json=body, headers=headers, timeout=60)
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "worker_lost"
        assert time.monotonic() - began < 20 and response.headers["retry-after"]
        deadline = time.monotonic() + 120
        while (ready := httpx.get(served.base_url + "/ready", timeout=10)).json()["processes"]["worker-0"][
            "state"
        ] != "crash_loop":
            assert time.monotonic() < deadline, ready.text
            time.sleep(0.5)
        assert ready.status_code == 503 and ready.json()["checks"]["processes"] is False
        log = served.log()
        assert log.count(f"cannot load model '{folder}': OverflowError") >= 2, log[-3000:]
        assert "restarting in 0.2 s" in log and "restarting in 0.4 s" in log  # the setting, doubled
        assert "Traceback" not in log
    finally:
        served.stop()
