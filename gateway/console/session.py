"""Console sign-in: the admin token, exchanged once for a signed session cookie.

The cookie (``fairlane_console``) is HTTP-only, SameSite=Strict, scoped to ``/console`` and Secure
behind HTTPS; it reads ``issued.nonce.signature``, the signature an HMAC-SHA256 under the admin
token, so every replica accepts it, nothing is stored, and changing the admin token signs everyone
out. Every change (POST) must carry the session's CSRF token, HMAC(admin token, nonce), in the
``X-CSRF-Token`` header (htmx sends it on every request from the page); a cross-site page can neither
read it nor send a custom header. Bearer tokens, tenant keys included, open nothing here.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from gateway.api.deps import StateDep

COOKIE = "fairlane_console"
CSRF_HEADER = "x-csrf-token"
SESSION_S = 12 * 3600  # a sign-in lasts this long
PREFIX = "/console"


class NotSignedIn(Exception):
    """No valid session cookie: pages redirect to the sign-in form, other calls answer 401."""


class CsrfRefused(Exception):
    """A change without the session's CSRF token (403)."""


@dataclass(frozen=True)
class ConsoleSession:
    nonce: str
    csrf: str


def _sign(secret: str, *parts: str) -> str:
    return hmac.new(secret.encode(), "|".join(parts).encode(), hashlib.sha256).hexdigest()


def new_cookie(secret: str, now: float | None = None) -> str:
    issued, nonce = str(int(now if now is not None else time.time())), secrets.token_urlsafe(16)
    return f"{issued}.{nonce}.{_sign(secret, 'session', issued, nonce)}"


def read_cookie(secret: str, cookie: str | None, now: float | None = None) -> ConsoleSession | None:
    """The session of a cookie signed with ``secret`` and not expired, else None."""
    if not secret or not cookie or cookie.count(".") != 2:
        return None
    issued, nonce, signature = cookie.split(".")
    if not hmac.compare_digest(signature, _sign(secret, "session", issued, nonce)):
        return None
    age = (now if now is not None else time.time()) - int(issued) if issued.isdigit() else -1
    if not 0 <= age <= SESSION_S:
        return None
    return ConsoleSession(nonce=nonce, csrf=_sign(secret, "csrf", nonce))


def token_matches(secret: str, token: str) -> bool:
    return bool(secret) and hmac.compare_digest(token.encode(), secret.encode())


def signed_in(request: Request, state: StateDep) -> ConsoleSession:
    session = read_cookie(state.settings.admin_token, request.cookies.get(COOKIE))
    if session is None:
        raise NotSignedIn()
    return session


def csrf_checked(request: Request, session: Annotated[ConsoleSession, Depends(signed_in)]) -> ConsoleSession:
    if not hmac.compare_digest(request.headers.get(CSRF_HEADER, ""), session.csrf):
        raise CsrfRefused()
    return session


SignedIn = Annotated[ConsoleSession, Depends(signed_in)]
Change = Annotated[ConsoleSession, Depends(csrf_checked)]  # a signed-in POST with its CSRF token
