"""The event loop stays free (reliability row 9): while 6 clients' huge prompts are rendered and
tokenized, `/health` keeps answering. A correctness check with a generous bound (no probe waits
as long as one prompt's tokenization, which it would if tokenizing ran on the loop); the latency
itself is measured by benchmarks/health_under_load.py."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from gateway_test_helpers import ADMIN_TOKEN, TINY_ENGINE, assert_openai_error, make_tenant_key

from benchmarks.common import tiny_model
from engine import assets

PROMPT_CHARS = 200_000
CLIENTS = 6


@pytest.fixture
def settings(redis_url, database_url, model_name):
    """The gateway tokenizes with SmolLM2's real tokenizer; the limits let 400K-character prompts in."""
    from gateway.settings import ApiSettings

    return ApiSettings(
        admin_token=ADMIN_TOKEN,
        redis_url=redis_url,
        database_url=database_url,
        engine={**TINY_ENGINE, "model": tiny_model()},
        served_model_name=model_name,
        request_timeout_s=30,
        quota_key_prefix=f"fairlane:quota:{model_name}",
        max_body_bytes=4 * PROMPT_CHARS,
        max_prompt_chars=PROMPT_CHARS,
    )


async def test_health_answers_while_six_huge_prompts_are_tokenized(app_client, running_worker, settings):
    _tenant, key = await make_tenant_key(app_client, "big")
    filler = "Lorem ipsum dolor sit amet, consectetur adipiscing elit. "
    text = (filler * (PROMPT_CHARS // len(filler) + 1))[:PROMPT_CHARS]
    messages = [{"role": "user", "content": text}]
    tokenizer = assets.load_tokenizer("smollm2")
    started = time.perf_counter()
    expected_tokens = len(assets.encode_chat(tokenizer, messages))
    one_tokenization_s = time.perf_counter() - started
    body = json.dumps({"model": settings.model_name, "messages": messages, "max_tokens": 1}).encode()
    headers = {"Authorization": f"Bearer {key}", "content-type": "application/json"}
    await app_client.get("/health")

    async def probe(until: asyncio.Task) -> list[float]:
        latencies = []
        while not until.done():
            start = time.perf_counter()
            response = await app_client.get("/health")
            latencies.append(time.perf_counter() - start)
            assert response.status_code == 200
            await asyncio.sleep(0.01)
        return latencies

    load = asyncio.ensure_future(
        asyncio.gather(
            *(app_client.post("/v1/chat/completions", content=body, headers=headers) for _ in range(CLIENTS))
        )
    )
    latencies = await probe(load)
    for (
        response
    ) in load.result():  # each was tokenized (the count is in the error), then refused by the context
        assert_openai_error(response, 400, param="messages", code="context_length_exceeded")
        assert f"the prompt has {expected_tokens} tokens" in response.json()["error"]["message"]
    assert len(latencies) >= CLIENTS
    assert max(latencies) < one_tokenization_s / 2, (max(latencies), one_tokenization_s)
