"""OpenAI-compatible GET /v1/models: the served base model and the calling tenant's LoRA adapters
(``<base>:<adapter name>``), never another tenant's. HEAD answers as GET (the server sends no
body), and a path with a trailing slash is served as the path without (never a 307 redirect)."""

from __future__ import annotations

from datetime import UTC

from fastapi import APIRouter

from gateway.api.deps import CurrentKey, StateDep
from gateway.api.errors import MODEL_ERROR_RESPONSES
from gateway.api.model_selection import adapter_model_name, select_model, tenant_adapters

router = APIRouter(prefix="/v1", tags=["openai"], responses=MODEL_ERROR_RESPONSES)


def _model_card(
    name: str, *, created: int = 0, owned_by: str = "fairlane", parent: str | None = None
) -> dict:
    card = {"id": name, "object": "model", "created": created, "owned_by": owned_by}
    if parent is not None:
        card["parent"] = parent  # the base model an adapter runs on
    return card


@router.get("/models")
@router.get("/models/", include_in_schema=False)
@router.head("/models", include_in_schema=False)
@router.head("/models/", include_in_schema=False)
async def list_models(auth: CurrentKey, state: StateDep) -> dict:
    """Lists the models this deployment serves to the caller: the base model and its tenant's adapters."""
    base = state.settings.model_name
    cards = [_model_card(base)]
    for row in await tenant_adapters(state, auth):
        created = (
            row.created_at if row.created_at.tzinfo else row.created_at.replace(tzinfo=UTC)
        )  # SQLite: naive UTC
        cards.append(
            _model_card(
                adapter_model_name(base, row.name),
                created=int(created.timestamp()),
                owned_by=auth.tenant_name,
                parent=base,
            )
        )
    return {"object": "list", "data": cards}


@router.get("/models/{model}")
@router.get("/models/{model}/", include_in_schema=False)
@router.head("/models/{model}", include_in_schema=False)
@router.head("/models/{model}/", include_in_schema=False)
async def get_model(model: str, auth: CurrentKey, state: StateDep) -> dict:
    """Retrieves one model (the base model or one of the caller's adapters)."""
    adapter = await select_model(state, auth, model)
    if adapter is None:
        return _model_card(model)
    return _model_card(model, owned_by=auth.tenant_name, parent=state.settings.model_name)
