"""Liveness (/health, always open) and readiness (/ready: Redis, database and a worker answer, a
separate quota Redis too when quotas refuse without it, and under ``fairlane serve`` no supervised
process in a crash loop)."""

from __future__ import annotations

from typing import Protocol

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from sqlalchemy import text
from starlette.concurrency import run_in_threadpool

from gateway.api.deps import StateDep

router = APIRouter(tags=["health"])


class Supervised(Protocol):
    """What /ready reads of ``fairlane serve``'s supervisor (gateway/cli/supervisor.py)."""

    def status(self) -> dict[str, dict]: ...


@router.get("/health")
async def health() -> dict:
    """The process is up."""
    return {"status": "ok"}


@router.get("/ready")
async def ready(state: StateDep, request: Request) -> JSONResponse:
    """Ready to serve: Redis and the database answer, and a worker serves the model."""
    checks: dict[str, bool] = {}
    try:
        checks["redis"] = bool(await state.redis.ping())
    except Exception:  # any failure means not ready; the body says which
        checks["redis"] = False

    def db_ok() -> bool:
        with state.db_engine.connect() as connection:
            return connection.execute(text("SELECT 1")).scalar() == 1

    try:
        checks["database"] = await run_in_threadpool(db_ok)
    except Exception:
        checks["database"] = False
    settings = state.settings
    if settings.quota_redis_url and settings.quota_on_redis_error == "closed":  # its own, and it gates
        checks["quota_redis"] = await state.quota_service.answers()  # every admission
    try:
        checks["worker"] = checks["redis"] and await state.lanes.has_worker(state.settings.model_name)
    except Exception:
        checks["worker"] = False
    body: dict = {"checks": checks}
    supervisor = request.app.state.supervisor
    if supervisor is not None:  # processes started by `fairlane serve`: state, pid, restarts, last exit
        body["processes"] = supervisor.status()
        checks["processes"] = all(p["state"] != "crash_loop" for p in body["processes"].values())
    ok = all(checks.values())
    return JSONResponse({"status": "ready" if ok else "not ready", **body}, status_code=200 if ok else 503)
