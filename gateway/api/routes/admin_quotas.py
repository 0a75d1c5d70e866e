"""Admin REST for quotas: set and read a tenant's or an API key's limits, read live usage.

A write goes to the database (the source of truth, tenancy ``Quota`` rows) and then to the quota
Redis (``Limiter.store_limits``), which every replica's admission script reads on each request: the
change is in force everywhere at the next request. If the Redis write fails the call answers 503
and may simply be repeated (the row is already stored).
"""

from __future__ import annotations

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from gateway.api.deps import AdminDep, SessionDep, StateDep
from gateway.api.errors import ADMIN_ERROR_RESPONSES, UnprocessableEntity
from gateway.api.routes.admin_tenants import check_tiers
from gateway.api.schemas.admin import DbId
from gateway.api.schemas.quotas import QuotaPublic, QuotaSet, QuotaUsagePublic
from quotas import Limiter, QuotaLimits
from tenancy import get_api_key, get_quota, get_tenant, set_quota

router = APIRouter(
    prefix="/admin", tags=["admin: quotas"], dependencies=[AdminDep], responses=ADMIN_ERROR_RESPONSES
)


def _limiter(state: StateDep) -> Limiter:
    limiter = state.quota_service.limiter
    if limiter is None:
        raise UnprocessableEntity("Quotas are not enabled on this gateway.")
    return limiter


def _validated(body: QuotaSet, state: StateDep) -> dict:
    check_tiers(state, allowed_tiers=body.allowed_tiers, tier_shares=list(body.tier_shares or {}))
    limits = body.model_dump()
    try:
        QuotaLimits.from_row(limits)
    except ValueError as exc:
        raise UnprocessableEntity(f"Invalid quota: {exc}.") from exc
    return limits


async def _put(
    session, state: StateDep, body: QuotaSet, tenant_id: int | None, key_id: int | None
) -> QuotaPublic:
    limits = _validated(body, state)

    def write() -> tuple[QuotaPublic, QuotaLimits]:
        owner = tenant_id if key_id is None else get_api_key(session, key_id=key_id).tenant_id
        row = set_quota(session, tenant_id=owner, key_id=key_id, **limits)
        return QuotaPublic.model_validate(row), QuotaLimits.from_row(row)

    public, stored = await run_in_threadpool(write)
    # a budget counts its UTC day's (month's) tokens, those charged before it was set included
    await _limiter(state).store_limits(str(public.tenant_id), stored, None if key_id is None else str(key_id))
    await state.key_cache.invalidate()  # cached keys carry the max_tokens cap
    return public


def _get(session, tenant_id: int | None, key_id: int | None) -> QuotaPublic:
    owner = (
        get_tenant(session, tenant_id=tenant_id).id
        if key_id is None
        else get_api_key(session, key_id=key_id).tenant_id
    )
    row = get_quota(session, tenant_id=owner, key_id=key_id)
    if row is None:
        return QuotaPublic(tenant_id=owner, key_id=key_id, configured=False)
    return QuotaPublic.model_validate(row)


@router.put("/tenants/{tenant_id}/quota", response_model=QuotaPublic)
async def set_tenant_quota(tenant_id: DbId, body: QuotaSet, session: SessionDep, state: StateDep):
    """Replace a tenant's quota (omitted limits: unlimited); in force on every replica at the next request."""
    return await _put(session, state, body, tenant_id, None)


@router.get("/tenants/{tenant_id}/quota", response_model=QuotaPublic)
def get_tenant_quota(tenant_id: DbId, session: SessionDep):
    """Get a tenant's quota."""
    return _get(session, tenant_id, None)


@router.get("/tenants/{tenant_id}/quota/usage", response_model=QuotaUsagePublic)
async def tenant_quota_usage(tenant_id: DbId, session: SessionDep, state: StateDep):
    """A tenant's live rate limits, requests in flight and token budgets used and remaining."""
    await run_in_threadpool(lambda: get_tenant(session, tenant_id=tenant_id))
    usage = await _limiter(state).store.usage(str(tenant_id))
    return QuotaUsagePublic.from_usage(usage, tenant_id=tenant_id, key_id=None)


@router.put("/keys/{key_id}/quota", response_model=QuotaPublic)
async def set_key_quota(key_id: DbId, body: QuotaSet, session: SessionDep, state: StateDep):
    """Replace an API key's own quota (its tenant's still applies; the stricter wins)."""
    return await _put(session, state, body, None, key_id)


@router.get("/keys/{key_id}/quota", response_model=QuotaPublic)
def get_key_quota(key_id: DbId, session: SessionDep):
    """Get an API key's own quota."""
    return _get(session, None, key_id)


@router.get("/keys/{key_id}/quota/usage", response_model=QuotaUsagePublic)
async def key_quota_usage(key_id: DbId, session: SessionDep, state: StateDep):
    """An API key's live rate limits, requests in flight and token budgets used and remaining."""
    tenant_id = await run_in_threadpool(lambda: get_api_key(session, key_id=key_id).tenant_id)
    usage = await _limiter(state).store.usage(str(tenant_id), str(key_id))
    return QuotaUsagePublic.from_usage(usage, tenant_id=tenant_id, key_id=key_id)
