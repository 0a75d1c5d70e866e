"""The FastAPI application: routes, error handlers, middleware and the replica's state."""

from __future__ import annotations

import asyncio
import inspect
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from gateway.api.errors import install_error_handlers
from gateway.api.middleware import RequestContextMiddleware
from gateway.api.ratelimit_headers import RateLimitHeadersMiddleware
from gateway.api.routes import (
    admin_adapters,
    admin_keys,
    admin_quotas,
    admin_tenants,
    admin_usage,
    completions,
    health,
    metrics,
    models,
)
from gateway.api.routes.admin_adapters import UPLOAD_OVERHEAD_BYTES
from gateway.api.routes.health import Supervised
from gateway.api.state import GatewayState
from gateway.api.tracing_middleware import TracingMiddleware
from gateway.console import install as install_console
from gateway.settings import ApiSettings, load_settings
from gateway.telemetry import gc_policy, tracing
from gateway.telemetry.loop_lag import LoopLagMonitor

SETTLE_GRACE_S = 5.0  # how long a stopping app waits for the requests cancelled at the drain's end
# FastAPI releases with native OpenTelemetry (a `telemetry` argument) would add a second server span,
# spans per dependency, and log records of validation failures that may quote the request body
# (a prompt): this gateway's own spans (TracingMiddleware and the request path's) replace them.
NATIVE_TELEMETRY_OFF = (
    {
        "telemetry": {
            "tracing": False,
            "metrics": False,
            "logs": False,
            "operation_spans": False,
            "auto_configure": False,
        }
    }
    if "telemetry" in inspect.signature(FastAPI).parameters
    else {}
)


async def _cancelled_requests_settle(timeout_s: float = SETTLE_GRACE_S) -> None:
    """Wait for the requests the server cancelled as it stops, up to ``timeout_s``: uvicorn cancels
    those still running when its drain times out and closes the app at once, while each still
    settles (shielded: quota, report, usage record); closing the usage writer first lost their
    records. A cancelled task is one whose cancellation is pending (``Task.cancelling()``)."""
    me = asyncio.current_task()
    cancelled = {t for t in asyncio.all_tasks() if t is not me and t.cancelling()}
    if cancelled:
        await asyncio.wait(cancelled, timeout=timeout_s)


def create_app(settings: ApiSettings | None = None, *, supervisor: Supervised | None = None) -> FastAPI:
    """A gateway replica for ``settings`` (read from the environment and the YAML file when omitted);
    ``supervisor``: what started the processes it relies on (``fairlane serve``), shown by /ready."""
    settings = settings or load_settings(ApiSettings, "fairlane gateway")
    traced = tracing.setup_tracing(settings, "fairlane-gateway")

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.gateway = await run_in_threadpool(GatewayState.open, settings)
        thresholds = gc_policy.freeze(generation=1)  # startup's objects: out of every later collection
        # Started after the freeze: its collection is not a pause of serving, and the GC pause
        # histogram must not show it as one.
        lag = LoopLagMonitor()
        lag.start()
        try:
            yield
        finally:
            gc_policy.thaw(thresholds)
            await lag.stop()
            await _cancelled_requests_settle()
            await app.state.gateway.close()
            if traced:
                await run_in_threadpool(tracing.shutdown_tracing)  # exports what is queued

    app = FastAPI(
        title="fairlane",
        version="0.1.0",
        lifespan=lifespan,
        description="Multi-tenant LLM gateway: OpenAI-compatible API and admin REST.",
        **NATIVE_TELEMETRY_OFF,
    )
    app.state.supervisor = supervisor
    install_error_handlers(app)
    for router in (
        health.router,
        completions.router,
        models.router,
        admin_tenants.router,
        admin_keys.router,
        admin_quotas.router,
        admin_adapters.router,
        admin_usage.router,
        metrics.router,
    ):
        app.include_router(router)
    install_console(app)
    if traced:  # innermost of the middleware: the request id is known, the span covers the route
        app.add_middleware(TracingMiddleware)
    app.add_middleware(
        RequestContextMiddleware,
        max_body_bytes=settings.max_body_bytes,
        upload_body_bytes=settings.max_adapter_bytes + UPLOAD_OVERHEAD_BYTES,
    )
    app.add_middleware(RateLimitHeadersMiddleware)
    return app
