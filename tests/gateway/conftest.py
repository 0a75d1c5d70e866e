"""Shared fixtures: the machine's real Redis, a tiny random-weight engine, unique model names."""

from __future__ import annotations

import os
import uuid

import pytest
import redis as redislib
from gateway_test_helpers import ADMIN_TOKEN, TINY, TINY_ENGINE, inproc_worker

REDIS_URL = os.environ.get("FAIRLANE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


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
