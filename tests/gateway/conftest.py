"""Shared fixtures: the machine's real Redis, a tiny random-weight engine, unique model names."""

from __future__ import annotations

import os
import uuid

import pytest
import redis as redislib

REDIS_URL = os.environ.get("FAIRLANE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
# A tiny Llama: fast enough to run hundreds of requests on 2 CPU cores.
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=256)


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
    for pattern in (f"lanes:{name}:*", f"workers:{name}", f"model:{name}"):
        keys = list(redis.scan_iter(match=pattern, count=1000))
        if keys:
            redis.delete(*keys)


@pytest.fixture(scope="session")
def tiny_engine_factory():
    from engine import Engine, EngineConfig

    def make(**overrides):
        config = dict(model="dummy", dtype="float32", num_threads=1, dummy_config=TINY, max_num_seqs=16,
                      max_num_batched_tokens=512, block_size=16, num_kv_blocks=64)
        config.update(overrides)
        return Engine(EngineConfig(**config))

    return make
