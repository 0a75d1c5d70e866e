"""OpenAI's ``x-ratelimit-*`` headers on every /v1 response that went through the quota check.

The quota service publishes a decision's headers for the request being served; this middleware adds
them to whatever response leaves for that request: the 200 (JSON or SSE), the 429, and errors met
after admission (a worker refusing the request, a timeout). Headers a response already carries
win. A pure ASGI middleware: streaming bodies pass through untouched.
"""

from __future__ import annotations

from contextvars import ContextVar

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# The headers of the request in this context. A mutable dict set by the middleware, so that what
# the route (running in a copied context, or a child task) adds is seen here.
_current: ContextVar[dict[str, str] | None] = ContextVar("fairlane_ratelimit_headers", default=None)


def publish(headers: dict[str, str]) -> None:
    """Send ``headers`` with the response of the request being served (no-op outside one)."""
    box = _current.get()
    if box is not None:
        box.update(headers)


class RateLimitHeadersMiddleware:
    """Adds the published rate-limit headers to responses of paths under ``prefix``."""

    def __init__(self, app: ASGIApp, prefix: str = "/v1/") -> None:
        self.app, self.prefix = app, prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(self.prefix):
            await self.app(scope, receive, send)
            return
        box: dict[str, str] = {}
        token = _current.set(box)

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start" and box:
                headers = MutableHeaders(scope=message)
                for name, value in box.items():
                    if name not in headers:
                        headers[name] = value
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        finally:
            _current.reset(token)
