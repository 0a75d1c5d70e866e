"""The FastAPI application: routes, error handlers, middleware and the replica's state."""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from gateway.errors import install_error_handlers
from gateway.middleware import RequestContextMiddleware
from gateway.ratelimit_headers import RateLimitHeadersMiddleware
from gateway.routes import admin_keys, admin_quotas, admin_tenants, completions, health, models
from gateway.settings import Settings
from gateway.state import GatewayState


def create_app(settings: Settings | None = None) -> FastAPI:
    """A gateway replica for ``settings`` (read from the environment when omitted)."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.gateway = await run_in_threadpool(GatewayState.open, settings)
        try:
            yield
        finally:
            await app.state.gateway.close()

    app = FastAPI(
        title="fairlane", version="0.1.0", lifespan=lifespan,
        description="Multi-tenant LLM gateway: OpenAI-compatible API and admin REST.",
    )
    install_error_handlers(app)
    for router in (health.router, completions.router, models.router, admin_tenants.router, admin_keys.router,
                   admin_quotas.router):
        app.include_router(router)
    app.add_middleware(RequestContextMiddleware, max_body_bytes=settings.max_body_bytes)
    app.add_middleware(RateLimitHeadersMiddleware)
    return app
