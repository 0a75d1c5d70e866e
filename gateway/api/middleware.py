"""ASGI middleware: an x-request-id on every response, a hard limit on request body size, and an
OpenAI answer for a request the server cancels as it stops."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.api.errors import PayloadTooLarge, ServiceUnavailable, error_body

ADAPTER_UPLOAD = re.compile(r"/admin/tenants/[^/]+/adapters/?")  # its body may be up to upload_body_bytes


class _Sent:
    """How far a response has gone out."""

    started = event_stream = ended = False


class RequestContextMiddleware:
    """Gives each request an id (``scope["state"]["request_id"]``, echoed as x-request-id) and
    answers 413 in the OpenAI error shape when the body exceeds ``max_body_bytes``, whether the
    client declared its length or streamed it chunked; an adapter upload's limit is
    ``upload_body_bytes``.

    A request still running when the server's drain runs out is cancelled by uvicorn, which
    answered it with a plain-text 500 and logged a traceback: it gets a 503 ``server_shutting_down``
    in OpenAI's shape (retry-after 1: another replica, or this one restarted, can take it) or, for
    a stream already started, that error as its last event."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int, upload_body_bytes: int | None = None) -> None:
        self.app, self.max_body_bytes = app, max_body_bytes
        self.upload_body_bytes = upload_body_bytes or max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        header = (b"x-request-id", request_id.encode())
        sent = _Sent()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), header]
                sent.started = True
                sent.event_stream = any(
                    k.lower() == b"content-type" and v.startswith(b"text/event-stream")
                    for k, v in message["headers"]
                )
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                sent.ended = True
            await send(message)

        limit = (
            self.upload_body_bytes
            if scope.get("method") == "POST" and ADAPTER_UPLOAD.fullmatch(scope["path"])
            else self.max_body_bytes
        )
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None:
            if not declared.isdigit() or int(declared) > limit:
                await self._reject(send_with_id, limit)
                return
            await self._serve(scope, receive, send_with_id, sent)  # the server holds the body to its length
            return
        # No declared length (chunked): read it all here, bounded, then replay it to the app.
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > limit:
                await self._reject(send_with_id, limit)
                return
            more = message.get("more_body", False)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self._serve(scope, replay, send_with_id, sent)

    async def _serve(self, scope: Scope, receive: Receive, send: Send, sent: _Sent) -> None:
        try:
            await self.app(scope, receive, send)
        except asyncio.CancelledError:  # the server is stopping: the task ends here, answered
            if not sent.ended:
                with contextlib.suppress(Exception):  # a client gone meanwhile
                    await _shutting_down(send, sent)

    async def _reject(self, send: Send, limit: int) -> None:
        error = PayloadTooLarge(f"The request body is larger than the limit of {limit} bytes.")
        body = json.dumps(error_body(error.message, error.error_type, error.param, error.code)).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


async def _shutting_down(send: Send, sent: _Sent) -> None:
    error = ServiceUnavailable(
        "The server is shutting down: send the request again.", code="server_shutting_down"
    )
    body = json.dumps(error_body(error.message, error.error_type, error.param, error.code)).encode()
    if sent.event_stream:  # the stream's last event
        await send({"type": "http.response.body", "body": b"data: " + body + b"\n\n", "more_body": False})
    elif not sent.started:
        await send(
            {
                "type": "http.response.start",
                "status": error.status_code,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"retry-after", b"1"),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
