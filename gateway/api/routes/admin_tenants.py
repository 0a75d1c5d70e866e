"""Admin REST for tenants: create, list, get, update, disable.

Routes that only touch the database are plain ``def`` (FastAPI runs them in its thread pool);
those that also tell every replica to drop cached keys (a Redis call) are ``async``.
"""

from __future__ import annotations

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from gateway.api.deps import AdminDep, SessionDep, StateDep
from gateway.api.errors import ADMIN_ERROR_RESPONSES, UnprocessableEntity
from gateway.api.schemas.admin import (
    DbId,
    PageAfter,
    PageLimit,
    TenantCreate,
    TenantPublic,
    TenantsPublic,
    TenantUpdate,
    fetch_limit,
    page_of,
)
from tenancy import create_tenant, disable_tenant, get_tenant, list_tenants, update_tenant

router = APIRouter(
    prefix="/admin/tenants", tags=["admin: tenants"], dependencies=[AdminDep], responses=ADMIN_ERROR_RESPONSES
)


def check_tiers(state: StateDep, **fields: list[str] | str | None) -> None:
    """Each field's tiers (a name or a list of names) are this deployment's; the error names the field."""
    known = state.settings.tiers
    for field, tiers in fields.items():
        for tier in [tiers] if isinstance(tiers, str) else tiers or []:
            if tier not in known:
                raise UnprocessableEntity(
                    f"Unknown tier {tier!r}: this deployment has {', '.join(known)}.", param=field
                )


@router.post("", status_code=201, response_model=TenantPublic)
def create(body: TenantCreate, session: SessionDep, state: StateDep):
    """Create a tenant."""
    check_tiers(state, allowed_tiers=body.allowed_tiers, default_tier=body.default_tier)
    return create_tenant(session, **body.model_dump())


@router.get("", response_model=TenantsPublic)
def list_all(
    session: SessionDep, include_disabled: bool = True, limit: PageLimit = None, after: PageAfter = None
):
    """List tenants by id, all of them or a page (``limit``, ``after``: the last id of the page before)."""
    rows = list_tenants(session, include_disabled=include_disabled, after=after, limit=fetch_limit(limit))
    page, more = page_of(rows, limit)
    return TenantsPublic(data=[TenantPublic.model_validate(t) for t in page], count=len(page), has_more=more)


@router.get("/{tenant_id}", response_model=TenantPublic)
def get(tenant_id: DbId, session: SessionDep):
    """Get one tenant."""
    return get_tenant(session, tenant_id=tenant_id)


@router.patch("/{tenant_id}", response_model=TenantPublic)
async def update(tenant_id: DbId, body: TenantUpdate, session: SessionDep, state: StateDep):
    """Change a tenant's name, weight, tiers or status; takes effect on every replica within 1 s."""
    check_tiers(state, allowed_tiers=body.allowed_tiers, default_tier=body.default_tier)
    tenant = await run_in_threadpool(
        lambda: update_tenant(session, tenant_id=tenant_id, **body.model_dump(exclude_unset=True))
    )
    await state.key_cache.invalidate()
    return tenant


@router.post("/{tenant_id}/disable", response_model=TenantPublic)
async def disable(tenant_id: DbId, session: SessionDep, state: StateDep):
    """Disable a tenant: its keys stop working on every replica within 1 s."""
    tenant = await run_in_threadpool(lambda: disable_tenant(session, tenant_id=tenant_id))
    await state.key_cache.invalidate()
    return tenant
