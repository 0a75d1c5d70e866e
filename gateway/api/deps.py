"""FastAPI dependencies as Annotated aliases: state, DB session, the calling tenant, the admin."""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from gateway.api.auth import AuthContext
from gateway.api.errors import AuthenticationFailed, PermissionDenied
from gateway.api.state import GatewayState
from gateway.telemetry import tracing
from tenancy.api_keys import INFERENCE_SCOPE  # what an API key needs for the OpenAI API

bearer = HTTPBearer(auto_error=False)  # the Authorization header's bearer token, or None
BearerDep = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


async def get_state(request: Request) -> GatewayState:
    """``async``: FastAPI runs a plain ``def`` dependency in its thread pool (a thread hand-off and
    back, on every request, for an attribute read)."""
    return request.app.state.gateway


StateDep = Annotated[GatewayState, Depends(get_state)]


def get_session(state: StateDep) -> Iterator[Session]:
    with state.session_factory() as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]


async def get_current_key(state: StateDep, credentials: BearerDep) -> AuthContext:
    if credentials is None or not credentials.credentials:
        raise AuthenticationFailed(
            "You didn't provide an API key. Send it as 'Authorization: Bearer fl-...'.",
            code="missing_api_key",
        )
    with tracing.span("auth"):
        context = await state.key_cache.lookup(credentials.credentials)
        if context is None:
            if state.key_cache.tenant_disabled(credentials.credentials):
                raise AuthenticationFailed(
                    "This API key's tenant is disabled: ask the operator to enable it.",
                    code="account_deactivated",
                )
            raise AuthenticationFailed("Incorrect API key provided, or the key was revoked.")
        tracing.set_attributes({"fairlane.tenant.id": str(context.tenant_id)})
    if INFERENCE_SCOPE not in context.scopes:
        raise PermissionDenied(
            f"This API key may not call the API: it needs the '{INFERENCE_SCOPE}' scope.",
            code="missing_scope",
        )
    return context


CurrentKey = Annotated[AuthContext, Depends(get_current_key)]


def require_admin(state: StateDep, credentials: BearerDep) -> None:
    token = credentials.credentials if credentials is not None else ""
    if not state.settings.admin_token or not hmac.compare_digest(
        token.encode(), state.settings.admin_token.encode()
    ):
        raise AuthenticationFailed(
            "Admin endpoints need 'Authorization: Bearer <admin token>'.", code="invalid_admin_token"
        )


AdminDep = Depends(require_admin)
