"""Fixtures shared by modules here: for the quota tests through HTTP (test_quotas_http.py,
test_quota_settlement_http.py), settings with a database, a model name and a quota key prefix of
their own and one real worker (tiny model) for each module; for the OpenAI logprobs and sampling
tests, one live SmolLM2 server (fp32) and its weights in Hugging Face; for modules that run on both
database backends, `sql_backend_url` and `sql_database_url` (a module overrides its own
`database_url` with them; nothing here overrides `database_url`)."""

from __future__ import annotations

import os
import uuid

import pytest
import redis as redislib
from gateway_test_helpers import ADMIN_TOKEN, TINY_ENGINE, inproc_worker
from serve_process import wait_ready
from served_smollm2 import MODEL, start_fp32_server
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tenancy import make_engine, upgrade

POSTGRES_ENV = "FAIRLANE_TEST_POSTGRES_URL"


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


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def sql_backend_url(request, tmp_path_factory):
    """One database per module and backend (PostgreSQL from FAIRLANE_TEST_POSTGRES_URL, set by
    .ci/run; skipped with a visible reason without it)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('db') / 'fairlane.db'}"
        return
    base_url = os.environ.get(POSTGRES_ENV)
    if not base_url:
        pytest.skip(f"{POSTGRES_ENV} is not set: PostgreSQL tests not run")
    admin = create_engine(base_url, isolation_level="AUTOCOMMIT")
    name = f"fairlane_test_{uuid.uuid4().hex[:12]}"
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(base_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def sql_database_url(sql_backend_url):
    """The module's database at the migration head, emptied for each test."""
    url = sql_backend_url
    upgrade(url)
    engine = make_engine(url)
    with engine.begin() as connection:
        for table in ("usage_records", "usage_hourly", "quotas", "adapters", "api_keys", "tenants"):
            connection.execute(text(f"DELETE FROM {table}"))
    engine.dispose()
    return url
