"""One trace per request across real processes: `fairlane serve` (gateway + one engine worker)
exporting over OTLP/HTTP to a receiver this test runs. Also: a preempted request shows the
preemption, a client's traceparent is the parent, and nothing secret reaches a log line or a span."""

from __future__ import annotations

import json
import os
import uuid

import httpx
import pytest
import redis as redislib
from gateway_test_helpers import ADMIN_TOKEN, admin_headers
from otlp_receiver import OTLPReceiver
from serve_process import free_port, start, wait_ready

from benchmarks.common import PEAKED_DUMMY_CONFIG

# A tiny random Llama; a KV cache of 24 blocks of 4 tokens (96 slots) for two requests of ~45
# prompt tokens each that grow while decoding: one of them is preempted.
MODEL_CONFIG = {**PEAKED_DUMMY_CONFIG, "max_position_embeddings": 256}
PROMPT = "zebra quokka marmalade 7341: please write something"  # must never be logged nor traced
SERVER_SPAN = "POST /v1/chat/completions"


@pytest.fixture(scope="module")
def traced(tmp_path_factory, redis_url):
    tmp = tmp_path_factory.mktemp("traced")
    model = f"test-{uuid.uuid4().hex[:10]}"
    port = free_port()
    with OTLPReceiver() as receiver:
        env = {
            "FAIRLANE_REDIS_URL": redis_url,
            "FAIRLANE_DATABASE_URL": f"sqlite:///{tmp / 'fairlane.db'}",
            "FAIRLANE_ENGINE__MODEL": "dummy",
            "FAIRLANE_ENGINE__DUMMY_CONFIG": json.dumps(MODEL_CONFIG),
            "FAIRLANE_SERVED_MODEL_NAME": model,
            "FAIRLANE_ADMIN_TOKEN": ADMIN_TOKEN,
            "FAIRLANE_ENGINE__NUM_THREADS": "1",
            "FAIRLANE_ENGINE__BLOCK_SIZE": "4",
            "FAIRLANE_ENGINE__NUM_KV_BLOCKS": "24",
            "FAIRLANE_ENGINE__ENABLE_PREFIX_CACHING": "false",
            "FAIRLANE_OTEL_ENDPOINT": receiver.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            "FAIRLANE_LOG_LEVEL": "DEBUG",
            "FAIRLANE_LOG_FORMAT": "json",
            "FAIRLANE_CONFIG": "",
        }
        served = start(["serve", "--port", str(port)], env, str(tmp / "serve.log"), port=port)
        try:
            wait_ready(served, timeout_s=300)
            with httpx.Client(base_url=served.base_url, timeout=120) as http:
                tenant = http.post("/admin/tenants", json={"name": "traced"}, headers=admin_headers()).json()
                key = http.post(
                    f"/admin/tenants/{tenant['id']}/keys", json={"name": "k"}, headers=admin_headers()
                ).json()["key"]
                yield {"served": served, "receiver": receiver, "http": http, "key": key, "model": model}
        finally:
            served.stop()
            client = redislib.Redis.from_url(redis_url)
            for k in client.scan_iter(match=f"*{model}*", count=1000):
                client.delete(k)


def chat(traced, *, max_tokens=8, headers=None, content=PROMPT) -> httpx.Response:
    response = traced["http"].post(
        "/v1/chat/completions",
        headers={"Authorization": f"Bearer {traced['key']}", **(headers or {})},
        json={
            "model": traced["model"],
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens,
        },
    )
    assert response.status_code == 200, response.text
    return response


def spans_of(traced, request_id: str) -> list[dict]:
    """Every span of the request's trace, once the gateway's and the worker's have all arrived."""

    def complete(spans):
        mine = [
            s
            for s in spans
            if request_id
            in (s["attributes"].get("fairlane.request_id"), s["attributes"].get("gen_ai.response.id"))
        ]
        names = {s["name"] for s in mine}
        return {SERVER_SPAN, "engine.request", "lane.wait"} <= names

    spans = traced["receiver"].wait_for(complete)
    trace_ids = {
        s["trace_id"]
        for s in spans
        if request_id
        in (s["attributes"].get("fairlane.request_id"), s["attributes"].get("gen_ai.response.id"))
    }
    assert len(trace_ids) == 1, trace_ids  # exactly one trace for one request
    (trace_id,) = trace_ids
    names = {"auth", "quota.admit", "lane.relay", "engine.prefill", "engine.decode"}
    return traced["receiver"].wait_for(
        lambda all_: names <= {s["name"] for s in all_ if s["trace_id"] == trace_id}
    ) and [s for s in traced["receiver"].spans if s["trace_id"] == trace_id]


def one(spans, name) -> dict:
    found = [s for s in spans if s["name"] == name]
    assert len(found) == 1, (name, [s["name"] for s in spans])
    return found[0]


def test_one_request_is_one_trace_from_gateway_through_lane_to_engine(traced):
    response = chat(traced)
    request_id, usage = response.headers["x-request-id"], response.json()["usage"]
    spans = spans_of(traced, request_id)
    server = one(spans, SERVER_SPAN)
    assert (
        server["parent_span_id"] is None
        and server["kind"] == "SERVER"
        and server["service"] == "fairlane-gateway"
    )
    for child in ("auth", "quota.admit", "lane.relay"):
        assert one(spans, child)["parent_span_id"] == server["span_id"], child
    lane, engine_span = one(spans, "lane.wait"), one(spans, "engine.request")
    assert lane["service"] == engine_span["service"] == "fairlane-worker" and lane["kind"] == "CONSUMER"
    assert lane["parent_span_id"] == engine_span["parent_span_id"] == server["span_id"]
    assert lane["end_ns"] <= engine_span["start_ns"] + 1_000 and server["start_ns"] <= lane["start_ns"]
    prefill, decode = one(spans, "engine.prefill"), one(spans, "engine.decode")
    assert prefill["parent_span_id"] == decode["parent_span_id"] == engine_span["span_id"]
    assert prefill["end_ns"] == decode["start_ns"]  # the first token
    assert [e["name"] for e in prefill["events"]].count("prefill_chunk") >= 1
    events = [e["name"] for e in engine_span["events"]]
    assert events[0] == "admitted" and "first_token" in events and events[-1] == "finished"

    attrs = server["attributes"]
    assert attrs["gen_ai.request.model"] == traced["model"] and attrs["gen_ai.request.max_tokens"] == 8
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert attrs["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    assert attrs["gen_ai.response.finish_reasons"] == [response.json()["choices"][0]["finish_reason"]]
    assert attrs["fairlane.tier"] == "standard" and attrs["fairlane.quota.decision"] == "allowed"
    assert attrs["fairlane.ttft_s"] > 0 and attrs["http.response.status_code"] == 200
    assert attrs["http.route"] == "/v1/chat/completions"
    worker = engine_span["attributes"]
    assert worker["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    assert worker["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert worker["fairlane.tenant.id"] == attrs["fairlane.tenant.id"] and worker["fairlane.preemptions"] == 0


def test_a_clients_traceparent_is_the_parent(traced):
    trace_id, parent_id = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    response = chat(traced, headers={"traceparent": f"00-{trace_id}-{parent_id}-01"})
    spans = spans_of(traced, response.headers["x-request-id"])
    server = one(spans, SERVER_SPAN)
    assert server["trace_id"] == trace_id and server["parent_span_id"] == parent_id
    assert one(spans, "engine.request")["trace_id"] == trace_id


def test_admin_and_console_requests_have_server_spans_and_static_files_none(traced):
    http, receiver, admin = traced["http"], traced["receiver"], admin_headers()
    calls = {
        "GET /admin/tenants": (http.get("/admin/tenants", headers=admin), 200),
        "GET /admin/tenants/{tenant_id}": (http.get("/admin/tenants/999999999", headers=admin), 404),
        "GET /console/login": (http.get("/console/login"), 200),
    }
    static = http.get("/console/static/console.css")
    assert static.status_code == 200
    ids = {}
    for name, (response, status) in calls.items():
        assert response.status_code == status, (name, response.text)
        ids[response.headers["x-request-id"]] = (name, status)
    spans = receiver.wait_for(
        lambda all_: set(ids) <= {s["attributes"].get("fairlane.request_id") for s in all_}
    )
    for span in spans:
        request_id = span["attributes"].get("fairlane.request_id")
        if request_id in ids:
            name, status = ids[request_id]
            assert span["name"] == name and span["kind"] == "SERVER", span
            assert span["attributes"]["http.response.status_code"] == status
            assert span["attributes"]["http.route"] == name.split(" ", 1)[1]
    assert static.headers["x-request-id"] not in {s["attributes"].get("fairlane.request_id") for s in spans}
    paths = [s["attributes"].get("url.path", "") for s in receiver.spans]
    assert not [p for p in paths if p.startswith("/console/static")]


def test_a_preempted_request_shows_the_preemption(traced):
    import concurrent.futures

    long_prompt = "x" * 20  # ~38 tokens with the chat template: two of 38 + 40 exceed the 96 slots
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        responses = list(pool.map(lambda _: chat(traced, max_tokens=40, content=long_prompt), range(2)))
    engine_spans = [one(spans_of(traced, r.headers["x-request-id"]), "engine.request") for r in responses]
    preempted = [s for s in engine_spans if s["attributes"]["fairlane.preemptions"] > 0]
    assert preempted, [[e["name"] for e in s["events"]] for s in engine_spans]
    events = preempted[0]["events"]
    names = [e["name"] for e in events]
    first = names.index("preempted")
    mode = events[first]["attributes"]["mode"]
    assert mode in ("recompute", "swap")
    resumed = events[first + names[first:].index("resumed")]
    assert resumed["attributes"]["mode"] == mode and names[-1] == "finished"


def test_no_key_token_or_prompt_in_any_log_line_or_span_attribute(traced):
    http, model = traced["http"], traced["model"]
    wrong_key = "fl-AAAAAAAA_" + "w" * 43
    bad = http.post(
        "/v1/chat/completions",
        headers={"Authorization": f"Bearer {wrong_key}"},
        json={"model": model, "messages": [{"role": "user", "content": PROMPT}]},
    )
    assert bad.status_code == 401
    refused = http.post(
        "/v1/chat/completions",
        headers={"Authorization": f"Bearer {traced['key']}"},
        json={
            "model": model,
            "messages": [{"role": "user", "content": PROMPT}],
            "tools": [{"type": "function"}],
        },
    )
    assert refused.status_code == 400
    malformed = http.post(
        "/v1/chat/completions",
        headers={"Authorization": f"Bearer {traced['key']}"},
        json={"model": model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": PROMPT},
    )
    assert malformed.status_code in (400, 422)
    response = chat(traced)  # at least one request, and its trace complete, before looking
    request_id = response.headers["x-request-id"]
    spans = spans_of(traced, request_id)
    log = traced["served"].log()
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    finished = [
        line
        for line in lines
        if line.get("logger") == "fairlane.request" and line["request_id"] == request_id
    ]
    assert len(finished) == 1  # one line per request, at completion
    line = finished[0]
    assert line["trace_id"] == spans[0]["trace_id"] and line["status"] in ("stop", "length")
    assert line["completion_tokens"] == response.json()["usage"]["completion_tokens"] and line["ttft_ms"] > 0
    assert any(line["level"] == "DEBUG" for line in lines)  # everything a run logs, debug included
    secrets = {
        "api key": traced["key"],
        "wrong key": wrong_key,
        "key secret": traced["key"].split("_", 1)[1],
        "admin token": ADMIN_TOKEN,
        "prompt": PROMPT,
        "prompt part": "quokka marmalade",
    }
    every_attribute = json.dumps(
        [
            [s["attributes"], [e["attributes"] for e in s["events"]], s["name"]]
            for s in traced["receiver"].spans
        ]
    )
    for what, secret in secrets.items():
        assert secret not in log, f"the {what} is in the log"
        assert secret not in every_attribute, f"the {what} is in a span"
    assert os.path.getsize(traced["served"].log_path) > 0
