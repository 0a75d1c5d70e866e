"""Which model a request names: the served base model, or one of the calling tenant's LoRA adapters
as ``<base>:<adapter name>`` (e.g. ``smollm2:support-bot``). Anything else, another tenant's adapter
included, is the same 404 (``model_not_found``): a tenant cannot learn what others have uploaded.

The adapter is looked up in the database on every request (one indexed query), so a deleted
adapter is refused at once on every replica.
"""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool

from engine import ErrorCode
from gateway.api.auth import AuthContext
from gateway.api.errors import NotFound
from gateway.api.state import GatewayState
from gateway.lanes.messages import LaneAdapter
from tenancy import Adapter, get_adapter, list_adapters

SEPARATOR = ":"


def model_not_found(model: str) -> NotFound:
    return NotFound(
        f"The model '{model}' does not exist or you do not have access to it.",
        param="model",
        code=ErrorCode.MODEL_NOT_FOUND.value,
    )


def adapter_model_name(base: str, adapter: str) -> str:
    return f"{base}{SEPARATOR}{adapter}"


async def select_model(state: GatewayState, auth: AuthContext, model: str) -> LaneAdapter | None:
    """None for the base model, the tenant's adapter for ``<base>:<name>``; else model_not_found."""
    base = state.settings.model_name
    if model == base:
        return None
    prefix = base + SEPARATOR
    if not model.startswith(prefix) or len(model) == len(prefix):
        raise model_not_found(model)
    name = model[len(prefix) :]

    def lookup() -> LaneAdapter | None:
        with state.session_factory() as session:
            row = get_adapter(session, tenant_id=auth.tenant_id, name=name, missing_ok=True)
            return (
                LaneAdapter(id=row.id, name=row.name, sha256=row.sha256)
                if row is not None and row.sha256
                else None
            )

    adapter = await run_in_threadpool(lookup)
    if adapter is None:
        raise model_not_found(model)
    return adapter


async def tenant_adapters(state: GatewayState, auth: AuthContext) -> list[Adapter]:
    """The calling tenant's adapters (for /v1/models)."""

    def rows() -> list[Adapter]:
        with state.session_factory() as session:
            return [r for r in list_adapters(session, tenant_id=auth.tenant_id) if r.sha256]

    return await run_in_threadpool(rows)
