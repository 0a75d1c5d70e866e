"""Shared fixtures: the machine's real Redis, a tiny random-weight engine, unique model names, and
for modules that run on both database backends `sql_backend_url` and `sql_database_url` (a module
overrides its own `database_url` with them; nothing here overrides `database_url`)."""

from __future__ import annotations

import os
import uuid

import pytest
import redis as redislib
from gateway_test_helpers import ADMIN_TOKEN, TINY, TINY_ENGINE, inproc_worker
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

REDIS_URL = os.environ.get("FAIRLANE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_ENV = "FAIRLANE_TEST_POSTGRES_URL"


@pytest.fixture(scope="session")
def redis_url() -> str:
    client = redislib.Redis.from_url(REDIS_URL)
    client.ping()  # the real server must answer: a test error, never a skip
    client.close()
    return REDIS_URL


@pytest.fixture
def redis(redis_url):
    client = redislib.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def model_name(redis):
    """A model name no other test uses, so lanes and results never mix; its keys are removed after."""
    name = f"test-{uuid.uuid4().hex[:10]}"
    yield name
    for pattern in (
        f"lanes:{name}:*",
        f"workers:{name}",
        f"model:{name}",
        f"worker:{name}:*",
        f"load:{name}",
    ):
        keys = list(redis.scan_iter(match=pattern, count=1000))
        if keys:
            redis.delete(*keys)


@pytest.fixture(scope="session")
def tiny_engine_factory():
    from engine import Engine, EngineConfig

    def make(**overrides):
        config = dict(
            model="dummy",
            dtype="float32",
            num_threads=1,
            dummy_config=TINY,
            max_num_seqs=16,
            max_num_batched_tokens=512,
            block_size=16,
            num_kv_blocks=64,
        )
        config.update(overrides)
        return Engine(EngineConfig(**config))

    return make


@pytest.fixture
def database_url(tmp_path):
    from tenancy import upgrade

    url = f"sqlite:///{tmp_path / 'fairlane.db'}"
    upgrade(url)
    return url


@pytest.fixture
def settings(redis_url, database_url, model_name):
    from gateway.settings import ApiSettings

    return ApiSettings(
        admin_token=ADMIN_TOKEN,
        redis_url=redis_url,
        database_url=database_url,
        engine=TINY_ENGINE,
        served_model_name=model_name,
        max_tokens_default=8,
        request_timeout_s=30,
        quota_key_prefix=f"fairlane:quota:{model_name}",
    )  # tenant ids repeat across test databases


@pytest.fixture
async def app_client(settings):
    """An in-process gateway replica (lifespan run) behind an httpx client."""
    import httpx

    from gateway.api.app import create_app

    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            client.app = app
            yield client


@pytest.fixture
def running_worker(settings, tiny_engine_factory):
    """A real Worker (tiny engine, real Redis) and its heartbeat, in threads of this process."""
    with inproc_worker(tiny_engine_factory(num_threads=None), settings) as (worker, _client):
        yield worker


@pytest.fixture
def free_tcp_port() -> int:
    """A port nothing listens on."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
    from tenancy import make_engine, upgrade

    upgrade(url)
    engine = make_engine(url)
    with engine.begin() as connection:
        for table in ("usage_records", "usage_hourly", "quotas", "adapters", "api_keys", "tenants"):
            connection.execute(text(f"DELETE FROM {table}"))
    engine.dispose()
    return url
