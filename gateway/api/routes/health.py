"""Liveness (/health, always open) and readiness (/ready: Redis, database and a worker answer, a
separate quota Redis too when quotas refuse without it, and under ``fairlane serve`` no supervised
process in a crash loop); a failing Redis is named in ``reasons`` and logged once."""

from __future__ import annotations

import logging
from typing import Protocol

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from redis.exceptions import AuthenticationError, ResponseError
from sqlalchemy import text
from starlette.concurrency import run_in_threadpool

from gateway.api.deps import StateDep

log = logging.getLogger(__name__)
router = APIRouter(tags=["health"])


class Supervised(Protocol):
    """What /ready reads of ``fairlane serve``'s supervisor (gateway/cli/supervisor.py)."""

    def status(self) -> dict[str, dict]: ...


def redis_failure(exc: Exception) -> str:
    """Why the lanes' Redis does not serve, in one line: a refused password, user or database number
    is named as such (it lasts until the URL is fixed), anything else as redis-py's error."""
    detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if isinstance(exc, AuthenticationError):
        return f"authentication to Redis failed (check the Redis URL's user and password): {detail}"
    if isinstance(exc, ResponseError):
        return f"Redis refused the connection: {detail}"
    return f"Redis does not answer: {detail}"


def _log_change(app_state, reason: str | None) -> None:
    """Log the lanes' Redis failing, and answering again, once each (not on every probe)."""
    last = getattr(app_state, "redis_failure", None)
    if reason != last:
        if reason is not None:
            log.error("not ready: %s", reason)
        else:
            log.info("ready: Redis answers again")
        app_state.redis_failure = reason


@router.get("/health")
async def health() -> dict:
    """The process is up."""
    return {"status": "ok"}


@router.get("/ready")
async def ready(state: StateDep, request: Request) -> JSONResponse:
    """Ready to serve: Redis and the database answer, and a worker serves the model."""
    checks: dict[str, bool] = {}
    reasons: dict[str, str] = {}
    try:
        checks["redis"] = bool(await state.redis.ping())
    except Exception as exc:  # any failure means not ready; the body says which, and why
        checks["redis"] = False
        reasons["redis"] = redis_failure(exc)
    _log_change(request.app.state, reasons.get("redis"))

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
    if reasons:
        body["reasons"] = reasons
    supervisor = request.app.state.supervisor
    if supervisor is not None:  # processes started by `fairlane serve`: state, pid, restarts, last exit
        body["processes"] = supervisor.status()
        checks["processes"] = all(p["state"] != "crash_loop" for p in body["processes"].values())
    ok = all(checks.values())
    return JSONResponse({"status": "ready" if ok else "not ready", **body}, status_code=200 if ok else 503)
