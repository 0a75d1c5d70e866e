"""The console's sign-in, sign-out, live view and static files, and ``install`` that adds the whole
console (every page module's router) to the gateway app."""

from __future__ import annotations

import time
from pathlib import Path

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import PlainTextResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool

from gateway.api.deps import StateDep
from gateway.console import adapters, keys, tenants, usage
from gateway.console.live import read_live
from gateway.console.session import (
    COOKIE,
    PREFIX,
    SESSION_S,
    Change,
    CsrfRefused,
    NotSignedIn,
    SignedIn,
    new_cookie,
    token_matches,
)
from gateway.console.views import render
from tenancy import list_tenants

router = APIRouter()
STATIC = Path(__file__).parent / "static"
NAMES_TTL_S = 30.0  # the live view's tenant names are re-read from the database this often at most


@router.get("", include_in_schema=False)
@router.get("/", include_in_schema=False)
async def home():
    return RedirectResponse(f"{PREFIX}/tenants", status_code=303)


@router.get("/login")
async def login_form(request: Request):
    """The sign-in form (the admin token)."""
    return render(request, "login.html", None)


@router.post("/login")
async def login(request: Request, state: StateDep):
    origin = request.headers.get("origin")
    if origin and origin.split("://", 1)[-1] != request.headers.get("host"):
        return PlainTextResponse("Cross-site sign-in refused.", status_code=403)
    form = await request.form()
    secret = state.settings.admin_token
    if not token_matches(secret, str(form.get("token", ""))):
        return render(
            request, "login.html", None, status=401, error="That is not this gateway's admin token."
        )
    response = RedirectResponse(f"{PREFIX}/tenants", status_code=303)
    response.set_cookie(
        COOKIE,
        new_cookie(secret),
        max_age=SESSION_S,
        path=PREFIX,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


@router.post("/logout")
async def logout(request: Request, session: Change):
    # From the page (htmx), a full navigation: a swapped-in sign-in form would keep the page's URL
    # and htmx (which swaps no 4xx) would show nothing for a wrong token.
    if "hx-request" in request.headers:
        response = Response(status_code=200, headers={"hx-redirect": f"{PREFIX}/login"})
    else:
        response = RedirectResponse(f"{PREFIX}/login", status_code=303)
    response.delete_cookie(COOKIE, path=PREFIX, httponly=True, samesite="strict")
    return response


async def _tenant_names(request: Request, state) -> dict[str, str]:
    """Tenant id -> name, kept on the app for NAMES_TTL_S (the live view reads no database otherwise)."""
    cached = getattr(request.app.state, "console_names", None)
    if cached is None or time.monotonic() - cached[0] > NAMES_TTL_S:

        def read():
            with state.session_factory() as db:
                return {str(t.id): t.name for t in list_tenants(db)}

        cached = request.app.state.console_names = (time.monotonic(), await run_in_threadpool(read))
    return cached[1]


async def _live_context(request: Request, state) -> dict:
    try:
        live = await read_live(state.redis, state.settings)
    except Exception as exc:  # Redis down: say so, keep polling
        return {"live": None, "error": f"Redis unreachable: {exc}"}
    return {
        "live": live,
        "names": await _tenant_names(request, state),
        "at": time.strftime("%H:%M:%S", time.gmtime()),
    }


@router.get("/live")
async def live(request: Request, session: SignedIn, state: StateDep):
    """Lanes, workers, each tenant's running sequences against its weighted share, and each tier's
    latencies against its targets; refreshed every 2 s from Redis."""
    return render(request, "live.html", session, page="live", **await _live_context(request, state))


@router.get("/live/panel")
async def live_panel(request: Request, session: SignedIn, state: StateDep):
    return render(request, "live_panel.html", session, **await _live_context(request, state))


def _not_signed_in(request: Request, _exc: Exception) -> Response:
    if request.method == "GET" and "hx-request" not in request.headers:
        return RedirectResponse(f"{PREFIX}/login", status_code=303)
    response = PlainTextResponse("Sign in to the console first.", status_code=401)
    response.headers["hx-redirect"] = f"{PREFIX}/login"
    return response


def _csrf_refused(_request: Request, _exc: Exception) -> Response:
    return PlainTextResponse(
        "This page's CSRF token is not its session's (signed in again in another tab?): reload the page.",
        status_code=403,
    )


for _module in (tenants, keys, adapters, usage):
    router.include_router(_module.router)


def install(app: FastAPI) -> None:
    """Serve the console at /console on ``app``."""
    app.include_router(router, prefix=PREFIX, include_in_schema=False)
    app.mount(f"{PREFIX}/static", StaticFiles(directory=STATIC), name="console-static")
    app.add_exception_handler(NotSignedIn, _not_signed_in)
    app.add_exception_handler(CsrfRefused, _csrf_refused)
