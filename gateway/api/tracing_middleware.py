"""The gateway's SERVER span of every /v1, admin API and console request (installed only while
tracing is on; the console's static files, the health probes and /metrics have none).

A client's ``traceparent`` (and ``tracestate``) header makes it the parent; the span covers the
whole response, a stream's last byte included, and is current while the route runs, so the
children (auth, quota, SLO gate, lane enqueue, relay) and the lane message's trace context hang
under it. Named ``{method} {route}``; HTTP attributes after the OpenTelemetry conventions.
"""

from __future__ import annotations

import time

from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.telemetry import tracing

TRACED_PREFIXES = ("/v1/", "/admin/", "/console")
UNTRACED_PREFIX = "/console/static/"


def traced(path: str) -> bool:
    return path.startswith(TRACED_PREFIXES) and not path.startswith(UNTRACED_PREFIX)


def route_template(path: str, route) -> str:
    """The matched route's path template as the client addressed it: a route of a router included
    under a prefix has its own path (the console's ``/login``, under ``/console``)."""
    regex = getattr(route, "path_regex", None)
    if regex is None or regex.match(path):
        return route.path
    for i in range(1, len(path)):
        if path[i] == "/" and regex.match(path[i:]):
            return path[:i] + route.path
    return route.path


class TracingMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not traced(scope["path"]) or not tracing.enabled():
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", []))
        parent = tracing.extract(
            headers.get(b"traceparent", b"").decode("latin-1"),
            headers.get(b"tracestate", b"").decode("latin-1"),
        )
        method, path = scope["method"], scope["path"]
        attributes = {
            "http.request.method": method,
            "url.path": path,
            "url.scheme": scope.get("scheme", "http"),
            "fairlane.request_id": scope.get("state", {}).get("request_id"),
        }
        sent_ns: int | None = None  # when the response's last byte went out
        span = tracing.tracer().start_span(
            f"{method} {path}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={k: v for k, v in attributes.items() if v is not None},
        )

        async def traced_send(message: Message) -> None:
            nonlocal sent_ns
            if message["type"] == "http.response.start":
                status = message["status"]
                span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    span.set_status(StatusCode.ERROR)
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                sent_ns = time.time_ns()

        try:
            with trace.use_span(span, end_on_exit=False, record_exception=True):
                await self.app(scope, receive, traced_send)
        finally:
            route = scope.get("route")
            if route is not None and getattr(route, "path", None):
                template = route_template(path, route)
                span.update_name(f"{method} {template}")
                span.set_attribute("http.route", template)
            # The report after the response (its background task) adds its attributes while the
            # span is open; the span's duration is the response's, up to its last byte.
            span.end(end_time=sent_ns)
