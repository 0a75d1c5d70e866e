"""Console page for LoRA adapters: a tenant's adapters, where each is loaded (the workers holding it,
from their heartbeats), upload (validated against the served model, as the REST upload is) and
delete. Both changes call the admin REST handlers."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from gateway.api.deps import StateDep
from gateway.api.routes import admin_adapters
from gateway.api.schemas.admin import DbId
from gateway.console.live import read_workers
from gateway.console.session import Change, SignedIn
from gateway.console.views import ACTION_ERRORS, error_text, render
from tenancy import list_adapters, list_tenants

router = APIRouter()


async def _page(request: Request, session, state, tenant_id: int | None, **context):
    def read():
        with state.session_factory() as db:
            tenants = list_tenants(db)
            chosen = tenant_id if tenant_id is not None else (tenants[0].id if tenants else None)
            return tenants, chosen, list_adapters(db, tenant_id=chosen) if chosen is not None else []

    tenants, chosen, adapters = await run_in_threadpool(read)
    loaded: dict[int, list[str]] = {}
    try:
        for worker in await read_workers(state.redis, state.settings.model_name):
            for name in worker.adapters:  # the engine knows an adapter as "<id>:<name>"
                adapter_id = name.split(":", 1)[0]
                if adapter_id.isdigit():
                    loaded.setdefault(int(adapter_id), []).append(worker.worker)
    except Exception as exc:  # Redis down: the page still lists the adapters
        context.setdefault("error", f"Workers unreachable: {exc}")
    return render(
        request,
        "adapters.html",
        session,
        page="adapters",
        tenants=tenants,
        tenant_id=chosen,
        adapters=adapters,
        loaded=loaded,
        **context,
    )


@router.get("/adapters")
async def adapters(request: Request, session: SignedIn, state: StateDep, tenant_id: int | None = None):
    """A tenant's LoRA adapters and the workers holding each."""
    return await _page(request, session, state, tenant_id)


@router.post("/tenants/{tenant_id}/adapters")
async def upload(tenant_id: DbId, request: Request, session: Change, state: StateDep):
    try:
        row = await admin_adapters.upload(tenant_id, request, state, admin_adapters.AdapterCaller(None))
    except ACTION_ERRORS as exc:
        return await _page(request, session, state, tenant_id, error=error_text(exc))
    return await _page(request, session, state, tenant_id, notice=f"Adapter {row.name!r} uploaded.")


@router.post("/adapters/{adapter_id}/delete")
async def delete(adapter_id: DbId, request: Request, session: Change, state: StateDep):
    tenant_id = None
    try:
        row = await admin_adapters.delete(adapter_id, state, admin_adapters.AdapterCaller(None))
        tenant_id = row.tenant_id
    except ACTION_ERRORS as exc:
        return await _page(request, session, state, tenant_id, error=error_text(exc))
    return await _page(request, session, state, tenant_id, notice=f"Adapter {row.name!r} deleted.")
