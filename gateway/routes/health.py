"""Liveness (/health, always open) and readiness (/ready: Redis, database and a worker answer)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from sqlalchemy import text
from starlette.concurrency import run_in_threadpool

from gateway.deps import StateDep

router = APIRouter(tags=["health"])


@router.get("/health")
async def health() -> dict:
    """The process is up."""
    return {"status": "ok"}


@router.get("/ready")
async def ready(state: StateDep) -> JSONResponse:
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
    try:
        checks["worker"] = checks["redis"] and await state.lanes.has_worker(state.settings.model_name)
    except Exception:
        checks["worker"] = False
    ok = all(checks.values())
    return JSONResponse({"status": "ready" if ok else "not ready", "checks": checks}, status_code=200 if ok else 503)
