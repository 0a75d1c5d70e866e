"""Admin REST for LoRA adapters: upload (multipart/form-data), list, get, delete.

A caller is the admin (the admin token: every tenant) or a tenant managing its own adapters with
one of its API keys that has the ``adapters`` scope; to such a key another tenant and its adapters
do not exist (404, the same answer as for a missing one). An upload is validated against the
served model before anything is kept (gateway/adapters/uploads.py): a bad one is a 400 naming what
is wrong, and leaves no file and no row.
"""

from __future__ import annotations

import hmac
import re
from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from engine.lora import AdapterError
from gateway.adapters.store import AdapterStore
from gateway.adapters.uploads import remove_adapter, store_adapter
from gateway.adapters.validate import served_shape
from gateway.api.deps import BearerDep, SessionDep, StateDep
from gateway.api.errors import (
    AuthenticationFailed,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    error_responses,
)
from gateway.api.schemas.admin import (
    ADAPTER_NAME_PATTERN,
    AdapterPublic,
    AdaptersPublic,
    DbId,
    PageAfter,
    PageLimit,
    fetch_limit,
    page_of,
)
from gateway.api.state import GatewayState
from tenancy import get_adapter_by_id, get_tenant, list_adapters
from tenancy.api_keys import ADAPTER_SCOPE  # an API key with it may manage its own tenant's adapters

# Tenant keys with the adapters scope may call these too: 403 for a key without it.
router = APIRouter(
    prefix="/admin", tags=["admin: adapters"], responses=error_responses(400, 401, 403, 404, 409, 413, 422)
)
UPLOAD_OVERHEAD_BYTES = (
    1 << 20
)  # an upload's body beyond its weights: the config, the name, multipart framing
MAX_CONFIG_BYTES = 1 << 20
FILES = {"adapter_config": "PEFT's adapter_config.json", "adapter_model": "PEFT's adapter_model.safetensors"}
UPLOAD_OPENAPI = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["name", *FILES],
                    "properties": {
                        "name": {
                            "type": "string",
                            "pattern": ADAPTER_NAME_PATTERN,
                            "description": "Unique within the tenant; clients call '<model>:<name>'.",
                        },
                        **{
                            name: {"type": "string", "format": "binary", "description": description}
                            for name, description in FILES.items()
                        },
                    },
                }
            }
        },
    }
}


@dataclass(frozen=True)
class AdapterCaller:
    tenant_id: int | None  # None: the admin

    def check_tenant(self, tenant_id: int) -> None:
        if self.tenant_id is not None and self.tenant_id != tenant_id:
            raise NotFound(f"tenant {tenant_id} not found", param="tenant_id")  # as tenancy says it


async def adapter_caller(state: StateDep, credentials: BearerDep) -> AdapterCaller:
    token = credentials.credentials if credentials is not None else ""
    admin = state.settings.admin_token
    if admin and token and hmac.compare_digest(token.encode(), admin.encode()):
        return AdapterCaller(tenant_id=None)
    context = await state.key_cache.lookup(token) if token else None
    if context is None:
        raise AuthenticationFailed(
            "Adapter endpoints need 'Authorization: Bearer <admin token>' or an API key of "
            f"the tenant with the '{ADAPTER_SCOPE}' scope."
        )
    if ADAPTER_SCOPE not in context.scopes:
        raise PermissionDenied(
            f"This API key may not manage adapters: it needs the '{ADAPTER_SCOPE}' scope.",
            code="missing_scope",
        )
    return AdapterCaller(tenant_id=context.tenant_id)


CallerDep = Annotated[AdapterCaller, Depends(adapter_caller)]


def adapter_store(state: GatewayState) -> AdapterStore:
    return AdapterStore(state.settings.adapter_store_dir)


def _file(form, field: str) -> UploadFile:
    part = form.get(field)
    if not isinstance(part, UploadFile):
        raise InvalidRequest(
            f"The upload has no '{field}' file: send {FILES[field]} as the multipart file field '{field}'.",
            param=field,
            code="missing_adapter_file",
        )
    return part


@router.post(
    "/tenants/{tenant_id}/adapters",
    status_code=201,
    response_model=AdapterPublic,
    openapi_extra=UPLOAD_OPENAPI,
)
async def upload(tenant_id: DbId, request: Request, state: StateDep, caller: CallerDep):
    """Upload a PEFT LoRA adapter (multipart: `name`, `adapter_config`, `adapter_model`).

    The adapter is validated against the served model.
    """
    caller.check_tenant(tenant_id)
    settings = state.settings
    async with request.form(max_files=len(FILES), max_fields=1) as form:
        name = form.get("name")
        if not isinstance(name, str) or not re.fullmatch(ADAPTER_NAME_PATTERN, name):
            raise InvalidRequest(
                "'name' must be 1-64 letters, digits, '_', '.' or '-' (starting with a letter or digit).",
                param="name",
                code="invalid_adapter_name",
            )
        config_file, weights_file = _file(form, "adapter_config"), _file(form, "adapter_model")
        config = await config_file.read(MAX_CONFIG_BYTES + 1)
        if len(config) > MAX_CONFIG_BYTES:
            raise PayloadTooLarge(
                f"adapter_config is larger than {MAX_CONFIG_BYTES} bytes.",
                param="adapter_config",
                code="adapter_too_large",
            )
        weights_size = weights_file.size if weights_file.size is not None else await _size(weights_file)
        if weights_size > settings.max_adapter_bytes:
            raise PayloadTooLarge(
                f"adapter_model has {weights_size} bytes; this server accepts at most "
                f"{settings.max_adapter_bytes}.",
                param="adapter_model",
                code="adapter_too_large",
            )
        if settings.engine.max_loras == 0:
            raise InvalidRequest(
                "This deployment serves no LoRA adapters (engine.max_loras is 0).", code="lora_disabled"
            )
        shape = await run_in_threadpool(served_shape, settings.engine.model, settings.engine.dummy_config)
        try:
            row = await run_in_threadpool(
                store_adapter,
                state.session_factory,
                adapter_store(state),
                tenant_id=tenant_id,
                name=name,
                config=config,
                weights=weights_file.file,
                weights_size=weights_size,
                shape=shape,
                max_rank=settings.engine.max_lora_rank,
            )
        except AdapterError as exc:
            raise InvalidRequest(exc.message, param=exc.param, code=exc.code) from None
    return AdapterPublic.model_validate(row)


async def _size(part: UploadFile) -> int:
    part.file.seek(0, 2)
    size = part.file.tell()
    part.file.seek(0)
    return size


@router.get("/tenants/{tenant_id}/adapters", response_model=AdaptersPublic)
def list_all(
    tenant_id: DbId, session: SessionDep, caller: CallerDep, limit: PageLimit = None, after: PageAfter = None
):
    """List a tenant's adapters by id, all or a page (``limit``, ``after``)."""
    caller.check_tenant(tenant_id)
    get_tenant(session, tenant_id=tenant_id)
    rows = list_adapters(session, tenant_id=tenant_id, after=after, limit=fetch_limit(limit))
    page, more = page_of(rows, limit)
    return AdaptersPublic(
        data=[AdapterPublic.model_validate(r) for r in page], count=len(page), has_more=more
    )


@router.get("/adapters/{adapter_id}", response_model=AdapterPublic)
def get(adapter_id: DbId, session: SessionDep, caller: CallerDep):
    """Get one adapter."""
    return get_adapter_by_id(session, adapter_id=adapter_id, tenant_id=caller.tenant_id)


@router.delete("/adapters/{adapter_id}", response_model=AdapterPublic)
async def delete(adapter_id: DbId, state: StateDep, caller: CallerDep):
    """Delete an adapter: requests running with it finish, later ones get 404; returns what was deleted."""
    return await run_in_threadpool(
        remove_adapter,
        state.session_factory,
        adapter_store(state),
        adapter_id=adapter_id,
        tenant_id=caller.tenant_id,
    )
