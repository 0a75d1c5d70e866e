"""The inference routes' lean handler serves a well-formed request without FastAPI's dependency
solver and answers exactly as FastAPI's own handler does; whatever it does not expect (a body that
does not parse or validate, dependency overrides) goes to FastAPI's handler. The body is JSON
whatever its content type says, as OpenAI reads it (in-process gateway, real Redis, real worker,
tiny model)."""

from __future__ import annotations

import fastapi.routing
import pytest
from fastapi import Request
from gateway_test_helpers import chat_body

from gateway.api.deps import get_state
from gateway.api.routes import completions
from gateway.api.routes.lean_route import LeanRoute, is_json


@pytest.fixture
def solved(monkeypatch):
    """The endpoints whose dependencies FastAPI's solver solved, in order."""
    seen: list[str] = []
    real = fastapi.routing.solve_dependencies

    async def watched(*args, **kwargs):
        seen.append(kwargs["dependant"].call.__name__)
        return await real(*args, **kwargs)

    monkeypatch.setattr(fastapi.routing, "solve_dependencies", watched)
    return seen


@pytest.fixture
def fastapi_only(app_client):
    """Send a request through FastAPI's own handler: any dependency override does (this one
    changes nothing)."""

    class Forced:
        def __enter__(self):
            app_client.app.dependency_overrides[get_state] = get_state

        def __exit__(self, *exc):
            app_client.app.dependency_overrides.clear()

    return Forced()


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_the_inference_routes_are_lean():
    assert {route.path: type(route) for route in completions.router.routes} == {
        "/v1/chat/completions": LeanRoute,
        "/v1/chat/completions/": LeanRoute,  # a trailing slash is served, not redirected
        "/v1/completions": LeanRoute,
        "/v1/completions/": LeanRoute,
    }


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_a_well_formed_request_answers_as_fastapi_s_handler_does(
    app_client, running_worker, settings, key, solved, fastapi_only, path
):
    body = chat_body(settings)
    if path == "/v1/completions":
        body = {k: v for k, v in body.items() if k != "messages"} | {"prompt": "Hi"}
    lean = await app_client.post(path, headers=_auth(key), json=body)
    assert lean.status_code == 200, lean.text
    assert solved == []  # the lean handler served it
    with fastapi_only:
        full = await app_client.post(path, headers=_auth(key), json=body)
    assert full.status_code == 200, full.text
    assert solved == [{"/v1/chat/completions": "chat_completions", "/v1/completions": "completions"}[path]]
    lean_body, full_body = lean.json(), full.json()
    for answer in (lean_body, full_body):  # the second prompt finds the first's blocks cached
        del answer["id"], answer["created"], answer["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert lean_body == full_body
    assert lean.headers["content-type"] == full.headers["content-type"]
    assert lean.headers.keys() == full.headers.keys()


@pytest.mark.parametrize("authorization", [None, "Bearer fl-not-a-key", "Basic abc", "Bearer "])
async def test_a_refused_key_reads_the_same(app_client, settings, solved, fastapi_only, authorization):
    headers = {} if authorization is None else {"Authorization": authorization}
    lean = await app_client.post("/v1/chat/completions", headers=headers, json=chat_body(settings))
    assert solved == []
    with fastapi_only:
        full = await app_client.post("/v1/chat/completions", headers=headers, json=chat_body(settings))
    assert lean.status_code == full.status_code == 401
    assert lean.json() == full.json()


@pytest.mark.parametrize(
    "content,content_type",
    [
        (b'{"model": "m", "messages": [', "application/json"),  # does not parse
        (b'{"model": "m"}', "application/json"),  # no messages
        (b'{"model": "m", "messages": [], "max_tokens": "many"}', "application/json"),
        (b"[1, 2]", "application/json"),  # not an object
        (b"\xff\xfe", "application/json"),  # not UTF-8
        (b'{"model": "m", "messages": [', "text/plain"),
        (b'{"model": "m", "messages": []}', None),
        (b"model=m", "application/x-www-form-urlencoded"),
    ],
)
async def test_what_it_does_not_expect_reads_as_fastapi_s_handler_answers_it(
    app_client, key, fastapi_only, content, content_type
):
    headers = _auth(key) | ({"content-type": content_type} if content_type else {})
    lean = await app_client.post("/v1/chat/completions", headers=headers, content=content)
    with fastapi_only:
        full = await app_client.post("/v1/chat/completions", headers=headers, content=content)
    assert lean.status_code == full.status_code
    assert lean.status_code in (400, 422), lean.text
    assert lean.json() == full.json()
    assert lean.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
async def test_a_json_body_is_json_whatever_its_content_type(
    app_client, running_worker, settings, key, solved, fastapi_only, content_type
):
    """OpenAI reads the body as JSON whatever the content type says (`curl -d` without -H sends a
    form's); so do both handlers."""
    import json

    headers = _auth(key) | ({"content-type": content_type} if content_type else {})
    content = json.dumps(chat_body(settings)).encode()
    lean = await app_client.post("/v1/chat/completions", headers=headers, content=content)
    assert lean.status_code == 200, lean.text
    assert solved == []
    with fastapi_only:
        full = await app_client.post("/v1/chat/completions", headers=headers, content=content)
    assert full.status_code == 200, full.text
    assert lean.json()["choices"] == full.json()["choices"]
    bad = await app_client.post("/v1/completions", headers=headers, content=b'{"model": ')
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json", bad.text


async def test_a_json_subtype_with_parameters_is_lean(app_client, running_worker, settings, key, solved):
    import json

    response = await app_client.post(
        "/v1/chat/completions",
        headers=_auth(key) | {"content-type": "application/vnd.api+json; charset=utf-8"},
        content=json.dumps(chat_body(settings)).encode(),
    )
    assert response.status_code == 200, response.text
    assert solved == []


@pytest.mark.parametrize(
    "content_type,expected",
    [
        ("application/json", True),
        ("Application/JSON; charset=utf-8", True),
        ("application/merge-patch+json", True),
        ("application/jsonx", False),
        ("text/json", False),
        ("text/plain", False),
        ("", False),
        (None, False),
    ],
)
def test_is_json(content_type, expected):
    assert is_json(content_type) is expected


def test_an_endpoint_of_another_shape_is_refused():
    async def other(body: dict, request: Request):  # pragma: no cover - never called
        return None

    with pytest.raises(TypeError, match="takes"):
        LeanRoute("/x", other, methods=["POST"])
