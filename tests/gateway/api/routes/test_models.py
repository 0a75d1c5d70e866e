"""GET /v1/models and /v1/models/{model}: HEAD answers as GET does (status and headers; the server
sends no body), and a trailing slash is served as the path without it, never a 307 redirect
(in-process gateway, real Redis, real database)."""

from __future__ import annotations

from gateway_test_helpers import assert_openai_error


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_head_answers_as_get(app_client, settings, key):
    for path in ("/v1/models", f"/v1/models/{settings.model_name}"):
        got = await app_client.get(path, headers=_auth(key))
        head = await app_client.head(path, headers=_auth(key))
        assert got.status_code == head.status_code == 200, head.text
        assert head.headers["content-type"] == got.headers["content-type"] == "application/json"
    assert (await app_client.head("/v1/models")).status_code == 401
    assert (await app_client.head("/v1/models/other", headers=_auth(key))).status_code == 404


async def test_a_trailing_slash_is_served_not_redirected(app_client, settings, key):
    for path in ("/v1/models", f"/v1/models/{settings.model_name}"):
        got = await app_client.get(path, headers=_auth(key))
        slashed = await app_client.get(path + "/", headers=_auth(key))
        assert slashed.status_code == 200, slashed.text
        assert slashed.json() == got.json()
    assert_openai_error(await app_client.get("/v1/models/", headers=_auth("fl-nope")), 401)
