"""OpenAI-compatible GET /v1/models."""

from __future__ import annotations

from fastapi import APIRouter

from gateway.api.deps import CurrentKey, StateDep
from gateway.api.errors import MODEL_ERROR_RESPONSES, NotFound

router = APIRouter(prefix="/v1", tags=["openai"], responses=MODEL_ERROR_RESPONSES)


def _model_card(name: str) -> dict:
    return {"id": name, "object": "model", "created": 0, "owned_by": "fairlane"}


@router.get("/models")
async def list_models(_auth: CurrentKey, state: StateDep) -> dict:
    """Lists the models this deployment serves."""
    return {"object": "list", "data": [_model_card(state.settings.model_name)]}


@router.get("/models/{model}")
async def get_model(model: str, _auth: CurrentKey, state: StateDep) -> dict:
    """Retrieves one model."""
    if model != state.settings.model_name:
        raise NotFound(f"The model '{model}' does not exist.", param="model", code="model_not_found")
    return _model_card(model)
