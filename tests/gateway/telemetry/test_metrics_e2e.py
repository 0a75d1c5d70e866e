"""/metrics of `fairlane serve` after a small mixed load of two tenants on two tiers each: request
counters equal what was sent per tier and status, token counters equal the usage records, the
engine's workers are in the same scrape and their KV gauge returns to idle. A separately started
`fairlane worker` serves its own /metrics."""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter

import httpx
import pytest
import redis as redislib
from gateway_test_helpers import ADMIN_TOKEN, TINY, admin_headers
from prometheus_client.parser import text_string_to_metric_families
from serve_process import free_port, start, wait_ready
from sqlalchemy import select

from tenancy import UsageRecord, make_engine, make_session_factory


def env_for(tmp, redis_url, model) -> dict:
    return {
        "FAIRLANE_REDIS_URL": redis_url,
        "FAIRLANE_DATABASE_URL": f"sqlite:///{tmp / 'fairlane.db'}",
        "FAIRLANE_ENGINE__MODEL": "dummy",
        "FAIRLANE_ENGINE__DUMMY_CONFIG": json.dumps(TINY),
        "FAIRLANE_SERVED_MODEL_NAME": model,
        "FAIRLANE_ADMIN_TOKEN": ADMIN_TOKEN,
        "FAIRLANE_ENGINE__NUM_THREADS": "1",
        "FAIRLANE_ENGINE__NUM_KV_BLOCKS": "64",
        "FAIRLANE_METRICS_TENANT_LABEL": "true",
        "FAIRLANE_CONFIG": "",
    }


def scrape(url: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of a /metrics page: (name, labels) -> value."""
    text = httpx.get(url, timeout=10).text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(samples, name: str, **labels) -> float:
    return sum(v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= ls)


@pytest.fixture(scope="module")
def served(tmp_path_factory, redis_url):
    tmp = tmp_path_factory.mktemp("metrics")
    model = f"test-{uuid.uuid4().hex[:10]}"
    port = free_port()
    serve = start(
        ["serve", "--port", str(port)], env_for(tmp, redis_url, model), str(tmp / "serve.log"), port=port
    )
    try:
        wait_ready(serve, timeout_s=300)
        yield {"serve": serve, "model": model, "tmp": tmp, "db": f"sqlite:///{tmp / 'fairlane.db'}"}
    finally:
        serve.stop()
        client = redislib.Redis.from_url(redis_url)
        for key in client.scan_iter(match=f"*{model}*", count=1000):
            client.delete(key)


def test_metrics_count_a_mixed_load_of_two_tenants_and_tiers(served):
    model, base = served["model"], served["serve"].base_url
    sent: Counter = Counter()  # (tier, status) -> requests
    tokens: Counter = Counter()  # (tier, tenant, kind) -> tokens, from the responses' usage
    with httpx.Client(base_url=base, timeout=120) as http:
        tenants = {}
        for name, tiers in (("alpha", ["priority", "standard"]), ("beta", ["standard", "batch"])):
            tenant = http.post(
                "/admin/tenants",
                json={"name": name, "allowed_tiers": tiers, "default_tier": tiers[-1]},
                headers=admin_headers(),
            ).json()
            key = http.post(
                f"/admin/tenants/{tenant['id']}/keys", json={"name": "k"}, headers=admin_headers()
            ).json()["key"]
            tenants[name] = (str(tenant["id"]), key)
        # beta may send 3 requests a minute, evenly spaced (GCRA): the later ones are refused (429).
        quota = {"requests_per_minute": 3, "tokens_per_minute": 100_000}
        assert (
            http.put(
                f"/admin/tenants/{tenants['beta'][0]}/quota", json=quota, headers=admin_headers()
            ).status_code
            == 200
        )
        plan = [
            ("alpha", "priority", False),
            ("alpha", "priority", True),
            ("alpha", "standard", False),
            ("beta", "batch", True),
            ("beta", "standard", False),
            ("beta", "batch", False),
            ("alpha", "standard", True),
            ("beta", "standard", False),
        ]  # beta's 4th: over its 3 a minute
        for i, (name, tier, stream) in enumerate(plan):
            tenant_id, key = tenants[name]
            body = {
                "model": model,
                "messages": [{"role": "user", "content": f"request {i} of {name}"}],
                "max_tokens": 4 + i,
                "service_tier": tier,
                "stream": stream,
            }
            if stream:
                body["stream_options"] = {"include_usage": True}
            response = http.post(
                "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
            )
            if response.status_code == 429:
                assert response.json()["error"]["code"] == "rate_limit_exceeded"
                sent[(tier, "rate_limit_exceeded")] += 1
                continue
            assert response.status_code == 200, response.text
            if stream:
                chunks = [
                    json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")
                ]
                usage = chunks[-1]["usage"]
                reason = next(
                    c["choices"][0]["finish_reason"]
                    for c in chunks
                    if c["choices"] and c["choices"][0]["finish_reason"]
                )
            else:
                usage, reason = response.json()["usage"], response.json()["choices"][0]["finish_reason"]
            sent[(tier, reason)] += 1
            tokens[(tier, tenant_id, "prompt")] += usage["prompt_tokens"]
            tokens[(tier, tenant_id, "output")] += usage["completion_tokens"]
    assert sent[("standard", "rate_limit_exceeded")] + sent[("batch", "rate_limit_exceeded")] >= 1  # mixed

    deadline = time.monotonic() + 30  # the worker's gauges after its last step
    while True:
        samples = scrape(base + "/metrics")
        if total(samples, "fairlane_engine_kv_blocks_used") == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    counted: Counter = Counter()
    for (n, ls), v in samples.items():
        if n == "fairlane_requests_total":
            counted[(dict(ls)["tier"], dict(ls)["status"])] += v
    assert +counted == +sent
    ran = sum(v for (tier, status), v in sent.items() if status != "rate_limit_exceeded")
    records = make_session_factory(make_engine(served["db"]))().scalars(select(UsageRecord)).all()
    assert len(records) == ran  # a request refused by its quota leaves no usage record
    for (tier, tenant_id, kind), value in tokens.items():
        name = f"fairlane_{kind}_tokens_total"
        assert total(samples, name, tier=tier, tenant=tenant_id) == value, (name, tier, tenant_id)
        field = "prompt_tokens" if kind == "prompt" else "completion_tokens"
        assert (
            sum(getattr(r, field) for r in records if r.tier == tier and str(r.tenant_id) == tenant_id)
            == value
        )
    assert total(samples, "fairlane_ttft_seconds_count") == ran
    assert total(samples, "fairlane_request_duration_seconds_count") == ran
    assert total(samples, "fairlane_lane_queue_seconds_count") == ran  # observed by the worker process
    for (tier, status), n in sent.items():
        if status == "rate_limit_exceeded":
            assert (
                total(samples, "fairlane_quota_refusals_total", tier=tier, limit="requests_per_minute") == n
            )
    assert total(samples, "fairlane_quota_store_up") == 1
    assert total(samples, "fairlane_lane_depth") == 0 and total(samples, "fairlane_lane_pending") == 0
    # The worker's engine, in the gateway's scrape: idle again, and every prompt token accounted for.
    assert total(samples, "fairlane_engine_kv_blocks_used") == 0
    assert total(samples, "fairlane_engine_kv_blocks_free") == 64
    assert total(samples, "fairlane_engine_running_sequences") == 0
    # An early start whose entry never came (the request refused at admission: the worker ran its
    # first step on the gateway's hint, then dropped it) is counted apart, tokens and admission.
    prompt = sum(v for (_, _, kind), v in tokens.items() if kind == "prompt")
    dropped = total(samples, "fairlane_lane_early_starts_total", outcome="dropped")
    assert total(samples, "fairlane_engine_computed_tokens_total", kind="prefill") + total(
        samples, "fairlane_engine_prefix_cache_hit_tokens_total"
    ) == prompt + total(samples, "fairlane_lane_early_start_dropped_tokens_total")
    refused = sum(v for (_, status), v in sent.items() if status == "rate_limit_exceeded")
    assert dropped <= refused  # only a refused request's early start is dropped here
    assert total(samples, "fairlane_engine_admissions_total") == ran + dropped
    assert total(samples, "fairlane_engine_preemptions_total") == 0
    steps = total(samples, "fairlane_engine_step_seconds_count")
    assert steps > 0 and total(samples, "fairlane_engine_batch_size_count") == steps


def test_a_separate_worker_serves_its_own_metrics(served, redis_url):
    port = free_port()
    env = {
        **env_for(served["tmp"], redis_url, served["model"]),
        "FAIRLANE_WORKER_METRICS_PORT": str(port),
        "FAIRLANE_WORKER_ID": "lone-worker",
    }
    worker = start(["worker"], env, str(served["tmp"] / "worker.log"))
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                samples = scrape(f"http://127.0.0.1:{port}/metrics")
                if total(samples, "fairlane_engine_kv_blocks_free", worker="lone-worker") == 64:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and worker.process.poll() is None, worker.log()
            time.sleep(0.3)
        assert total(samples, "fairlane_engine_kv_blocks_used", worker="lone-worker") == 0
        assert not any(
            n == "fairlane_requests_total" and v for (n, _), v in samples.items()
        )  # gateway's, not its
    finally:
        worker.stop()
