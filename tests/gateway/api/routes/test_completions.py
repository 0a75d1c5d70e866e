"""A non-streamed response whose whole output came with the first results (``max_tokens`` 1, one
prompt or several) is answered without the relay's waiting machinery (a task group and a watcher of
the client's connection), and reads the same as one that waited for more (in-process gateway, real
Redis, real worker, tiny model)."""

from __future__ import annotations

import pytest

from gateway.api import relay


@pytest.fixture
def in_hand(monkeypatch):
    """Every Generation.in_hand the routes read, in order."""
    seen: list[bool] = []
    real = relay.Generation.in_hand

    def watched(self) -> bool:
        seen.append(real.fget(self))
        return seen[-1]

    monkeypatch.setattr(relay.Generation, "in_hand", property(watched))
    return seen


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.parametrize("max_tokens,n", [(1, 1), (1, 2), (3, 1), (3, 2)])
async def test_a_chat_answered_with_or_without_waiting(
    app_client, running_worker, settings, key, in_hand, max_tokens, n
):
    body = {
        "model": settings.model_name,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": max_tokens,
        "n": n,
        "ignore_eos": True,
        "temperature": 0,
    }
    response = await app_client.post("/v1/chat/completions", headers=_auth(key), json=body)
    assert response.status_code == 200, response.text
    # n > 1: each choice is a result of its own, and the first is not the request's last
    assert in_hand == [max_tokens == 1 and n == 1]
    choices = response.json()["choices"]
    assert [c["index"] for c in choices] == list(range(n))
    for choice in choices:
        assert choice["finish_reason"] == "length"
        assert choice["message"]["content"].count(" t") == max_tokens  # the tiny model's ids as text
    assert response.json()["usage"]["completion_tokens"] == max_tokens * n


async def test_several_prompts_whose_outputs_all_came_at_once(
    app_client, running_worker, settings, key, in_hand
):
    body = {"model": settings.model_name, "prompt": ["Hi", "Bye"], "max_tokens": 1, "ignore_eos": True}
    response = await app_client.post("/v1/completions", headers=_auth(key), json=body)
    assert response.status_code == 200, response.text
    assert in_hand == [True]
    choices = response.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1]
    assert all(c["text"].count(" t") == 1 and c["finish_reason"] == "length" for c in choices)
    assert response.json()["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("path", ["/v1/chat/completions/", "/v1/completions/"])
async def test_a_trailing_slash_is_served_not_redirected(app_client, running_worker, settings, key, path):
    body = {"model": settings.model_name, "max_tokens": 2, "ignore_eos": True, "temperature": 0}
    body |= (
        {"prompt": "Hi"} if path == "/v1/completions/" else {"messages": [{"role": "user", "content": "Hi"}]}
    )
    slashed = await app_client.post(path, headers=_auth(key), json=body)
    assert slashed.status_code == 200, slashed.text
    plain = await app_client.post(path.rstrip("/"), headers=_auth(key), json=body)
    assert slashed.json()["choices"] == plain.json()["choices"]
