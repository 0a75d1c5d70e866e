"""Rows 5-7 and 9-13 of the reliability probe, each a regression test: bad or careless input is a 4xx in
the OpenAI error shape, never a 5xx; null means the default; OpenAI's names are spoken back.
(Row 7, admin ids and limits beyond the database's range, is test_admin_int_range.py on both
database backends. Rows 1-4, process and Redis faults, are tests/gateway/cli/test_serve_faults.py and
test_redis_outage.py; row 8, control tokens in user text, tests/engine/test_special_tokens_text.py
and test_tokenization_http.py; row 9 also test_big_prompts_loop.py; schemathesis over the whole
spec, test_schemathesis_spec.py.)"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime

import pytest
from gateway_test_helpers import admin_headers, assert_openai_error, make_tenant_key


@pytest.fixture
async def key(app_client):
    _tenant, key = await make_tenant_key(
        app_client, "hostile", allowed_tiers=["priority", "standard", "batch"]
    )
    return key


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def _complete(app_client, settings, key, **extra):
    body = {
        "model": settings.model_name,
        "prompt": "Hi",
        "max_tokens": 2,
        "temperature": 0,
        "ignore_eos": True,
        **extra,
    }
    return await app_client.post(
        "/v1/completions",
        content=json.dumps(body),
        headers={**_auth(key), "content-type": "application/json"},
    )


@pytest.mark.parametrize(
    "field, value",
    [
        ("max_tokens", 1e40),
        ("max_tokens", 2**70),
        ("seed", 1e30),
        ("seed", -(2**63) - 1),
        ("seed", 2**64),
        ("top_k", 1e30),
        ("top_k", 2**40),
        ("prompt", [2**70]),
        ("prompt", [[5, 2**63]]),
        ("max_tokens", True),
        ("n", True),
        ("top_k", "5"),
    ],
)
async def test_row5_10_integers_out_of_any_range_or_not_integers_are_4xx(
    app_client, running_worker, settings, key, field, value
):
    response = await _complete(app_client, settings, key, **{field: value})
    assert 400 <= response.status_code < 500, response.text
    assert_openai_error(response, response.status_code)


async def test_row5_integers_within_64_bits_but_beyond_the_model_are_400(
    app_client, running_worker, settings, key
):
    vocab = settings.engine.dummy_config["vocab_size"]
    assert_openai_error(
        await _complete(app_client, settings, key, max_tokens=2**31 - 1),
        400,
        param="max_tokens",
        code="context_length_exceeded",
    )
    assert_openai_error(await _complete(app_client, settings, key, top_k=vocab + 1), 400, param="top_k")
    assert_openai_error(await _complete(app_client, settings, key, prompt=[1, vocab]), 400, param="prompt")
    for seed in (-(2**63), 2**63 - 1):  # the 64-bit range itself is fine
        assert (await _complete(app_client, settings, key, seed=seed)).status_code == 200
    assert (await _complete(app_client, settings, key, top_k=vocab)).status_code == 200


@pytest.mark.parametrize(
    "field, value",
    [("stop", "\ud800"), ("stop", ["ok", "\udfff"]), ("prompt", "a\ud800"), ("user", "\ud800")],
)
async def test_row6_lone_surrogates_are_4xx(app_client, running_worker, settings, key, field, value):
    response = await _complete(app_client, settings, key, **{field: value})
    assert_openai_error(response, 422, param=field if isinstance(value, str) else None)


async def test_row6_lone_surrogate_in_a_chat_message_is_4xx(app_client, running_worker, settings, key):
    body = {"model": settings.model_name, "messages": [{"role": "user", "content": "\ud800"}]}
    response = await app_client.post(
        "/v1/chat/completions",
        content=json.dumps(body),
        headers={**_auth(key), "content-type": "application/json"},
    )
    assert 400 <= response.status_code < 500 and "error" in response.json()


async def test_row9_prompts_over_the_character_limit_are_refused_before_tokenizing(app_client, settings, key):
    huge = "x" * (settings.max_prompt_chars + 1)
    responses = await asyncio.gather(
        *(_complete(app_client, settings, key, prompt=huge) for _ in range(3)), app_client.get("/health")
    )
    for response in responses[:-1]:
        assert_openai_error(response, 400, param="prompt", code="context_length_exceeded")
    assert responses[-1].status_code == 200


async def test_row10_null_means_the_default(app_client, running_worker, settings, key):
    response = await _complete(
        app_client,
        settings,
        key,
        n=None,
        stream=None,
        temperature=None,
        top_p=None,
        stop=None,
        seed=None,
        echo=None,
        logprobs=None,
        stream_options=None,
    )
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["finish_reason"] == "length"


async def test_row11_tenant_weights_outside_a_sane_range_are_422(app_client):
    for weight in (5e-324, 0, -1, 1e300):
        response = await app_client.post(
            "/admin/tenants",
            json={"name": f"w{abs(hash(weight))}", "weight": weight},
            headers=admin_headers(),
        )
        assert_openai_error(response, 422, param="weight")


async def test_row12_a_tiny_temperature_is_greedy(app_client, running_worker, settings, key):
    greedy = await _complete(app_client, settings, key, temperature=0, max_tokens=6)
    tiny = await _complete(app_client, settings, key, temperature=1e-300, max_tokens=6)
    assert tiny.status_code == 200 and greedy.status_code == 200
    text = tiny.json()["choices"][0]["text"]
    assert text and text == greedy.json()["choices"][0]["text"]


@pytest.mark.parametrize(
    "asked, answered",
    [
        ("auto", "default"),
        ("default", "default"),
        ("priority", "priority"),
        ("flex", "flex"),
        ("standard", "default"),
        ("batch", "flex"),
    ],
)
async def test_row13_service_tier_in_openai_names(app_client, running_worker, settings, key, asked, answered):
    response = await _complete(app_client, settings, key, service_tier=asked)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["service_tier"] == answered
    assert isinstance(body["system_fingerprint"], str) and body["system_fingerprint"]


async def test_row13_timestamps_carry_their_timezone(app_client, key):
    tenants = (await app_client.get("/admin/tenants", headers=admin_headers())).json()
    tenant = tenants["data"][0] if "data" in tenants else tenants[0]
    keys = (await app_client.get(f"/admin/tenants/{tenant['id']}/keys", headers=admin_headers())).json()
    usage = (await app_client.get(f"/admin/tenants/{tenant['id']}/usage", headers=admin_headers())).json()
    stamps = [tenant["created_at"], usage["since"], usage["until"]]
    stamps += [k["created_at"] for k in (keys["data"] if "data" in keys else keys)]
    for stamp in stamps:
        assert datetime.fromisoformat(stamp).tzinfo is not None, stamp


async def test_row13_openapi_lists_the_errors_of_the_v1_routes(app_client):
    spec = (await app_client.get("/openapi.json")).json()
    for path in ("/v1/chat/completions", "/v1/completions"):
        responses = spec["paths"][path]["post"]["responses"]
        for status in ("400", "401", "403", "404", "413", "422", "429", "503", "504"):
            assert status in responses, (path, status)
            assert "error" in json.dumps(responses[status]).lower()
