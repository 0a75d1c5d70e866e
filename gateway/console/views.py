"""Rendering: the Jinja2 templates, their filters, and the text of an error a change may meet."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from fastapi import Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates
from pydantic import ValidationError as PydanticValidationError
from starlette.datastructures import FormData

from gateway.api.errors import GatewayError
from gateway.console.session import ConsoleSession
from tenancy import TenancyError

HERE = Path(__file__).parent
TEMPLATES = Jinja2Templates(directory=HERE / "templates")
ACTION_ERRORS = (GatewayError, TenancyError, PydanticValidationError, ValueError)
# What a console page may load: its own files only (no inline script, nothing from elsewhere).
SECURITY_HEADERS = {
    "content-security-policy": "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; frame-ancestors 'none'; base-uri 'self'; form-action 'self'",
    "x-frame-options": "DENY",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}
PAGES = (("tenants", "Tenants"), ("adapters", "Adapters"), ("usage", "Usage"), ("live", "Live"))


def _when(value: datetime | None) -> str:
    if value is None:
        return "—"
    value = value.replace(tzinfo=UTC) if value.tzinfo is None else value
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def _num(value) -> str:
    if value is None:
        return "—"
    return f"{value:,}" if isinstance(value, int) else f"{value:,.3g}"


TEMPLATES.env.filters["when"] = _when
TEMPLATES.env.filters["num"] = _num


def render(
    request: Request, name: str, session: ConsoleSession | None, *, status: int = 200, **context
) -> HTMLResponse:
    """A page (or fragment) with what every page shows: the CSRF token, the tiers, the model."""
    settings = request.app.state.gateway.settings
    context = {
        "csrf": session.csrf if session else "",
        "tiers": settings.tiers,
        "model": settings.model_name,
        "pages": PAGES,
        **context,
    }
    response = TEMPLATES.TemplateResponse(request, name, context, status_code=status)
    response.headers.update(SECURITY_HEADERS)
    return response


def error_text(exc: Exception) -> str:
    """What the operator reads when a change is refused."""
    if isinstance(exc, PydanticValidationError):
        return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in exc.errors())
    return getattr(exc, "message", None) or str(exc)


def number(form: FormData, name: str, kind=float):
    """A form field as ``kind`` (int or float); empty: None."""
    raw = str(form.get(name) or "").strip()
    if not raw:
        return None
    try:
        return kind(raw)
    except ValueError:
        raise ValueError(f"{name}: {raw!r} is not a{'n integer' if kind is int else ' number'}") from None


def tier_shares(form: FormData, tiers: list[str]) -> dict[str, float] | None:
    """Fields ``share_<tier>`` as {tier: fraction}; None when every one is empty."""
    shares = {t: number(form, f"share_{t}") for t in tiers}
    shares = {t: v for t, v in shares.items() if v is not None}
    return shares or None
