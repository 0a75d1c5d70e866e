"""Fixtures shared by modules here: for the quota tests through HTTP (test_quotas_http.py,
test_quota_settlement_http.py), settings with a database, a model name and a quota key prefix of
their own and one real worker (tiny model) for each module; for the OpenAI logprobs and sampling
tests, one live SmolLM2 server (fp32) and its weights in Hugging Face. (`sql_backend_url` and
`sql_database_url`, for modules that run on both database backends, are in tests/gateway/conftest.py.)"""

from __future__ import annotations

import uuid

import pytest
import redis as redislib
from gateway_test_helpers import ADMIN_TOKEN, TINY_ENGINE, inproc_worker
from serve_process import wait_ready
from served_smollm2 import MODEL, start_fp32_server

from tenancy import upgrade


@pytest.fixture(scope="module")
def quota_settings(tmp_path_factory, redis_url):
    """Settings shared by a module: one database, one model name, one quota key prefix."""
    from gateway.settings import ApiSettings

    database_url = f"sqlite:///{tmp_path_factory.mktemp('quotas') / 'fairlane.db'}"
    upgrade(database_url)
    prefix = f"fltest:gwquota:{uuid.uuid4().hex[:10]}"
    yield ApiSettings(
        admin_token=ADMIN_TOKEN,
        redis_url=redis_url,
        database_url=database_url,
        engine=TINY_ENGINE,
        served_model_name=f"test-{uuid.uuid4().hex[:10]}",
        max_tokens_default=8,
        request_timeout_s=30,
        quota_key_prefix=prefix,
    )
    client = redislib.Redis.from_url(redis_url)
    for key in client.scan_iter(match=f"{prefix}:*", count=1000):
        client.delete(key)
    client.close()


@pytest.fixture(scope="module")
def quota_worker(quota_settings, tiny_engine_factory):
    """One real Worker for a module (an engine is slow to build on a busy machine)."""
    model = quota_settings.model_name
    with inproc_worker(tiny_engine_factory(num_threads=None), quota_settings) as (worker, client):
        yield worker
        for pattern in (f"lanes:{model}:*", f"workers:{model}", f"model:{model}", f"worker:{model}:*"):
            for key in client.scan_iter(match=pattern, count=1000):
                client.delete(key)


@pytest.fixture(scope="package")
def fp32_server(tmp_path_factory):
    """`fairlane serve --dev` on SmolLM2 in float32, shared by test_openai_logprobs_e2e.py and
    test_openai_sampling_e2e.py (a server start loads the model in three processes)."""
    served = start_fp32_server(tmp_path_factory.mktemp("serve-fp32"))
    try:
        yield wait_ready(served, timeout_s=240)
    finally:
        served.stop()


@pytest.fixture(scope="package")
def fp32_hf(fp32_server):
    """The served weights as Hugging Face loads them (the folder the server's engine converted)."""
    import torch
    from transformers import AutoModelForCausalLM

    from engine import assets

    path = assets.converted_dir(assets.resolve_model(MODEL))
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
