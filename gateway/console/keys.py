"""Console pages for a tenant's API keys (create: the secret shown once; revoke; last used) and its
quotas (every limit of the tenant or one key, with the live usage beside each, from the quota
Redis). Both go through the admin REST handlers."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse
from starlette.concurrency import run_in_threadpool

from gateway.api.deps import StateDep
from gateway.api.routes import admin_keys, admin_quotas
from gateway.api.schemas.admin import DB_ID_MAX, ApiKeyCreate, DbId
from gateway.api.schemas.quotas import QuotaSet
from gateway.console.session import PREFIX, Change, SignedIn
from gateway.console.views import ACTION_ERRORS, error_text, number, render, tier_shares
from tenancy import get_api_key, get_tenant, list_api_keys
from tenancy.api_keys import SCOPES

router = APIRouter()
LIMITS = (  # (field, label, the live usage shown beside it)
    ("requests_per_minute", "Requests per minute", "requests"),
    ("tokens_per_minute", "Tokens per minute", "tokens"),
    ("max_concurrency", "Requests in flight", "in_flight"),
    ("daily_token_budget", "Tokens per UTC day", "daily"),
    ("monthly_token_budget", "Tokens per UTC month", "monthly"),
    ("max_tokens_per_request", "max_tokens per request", None),
)


async def _keys_page(request: Request, session, state, tenant_id: int, **context):
    def read():
        with state.session_factory() as db:
            return get_tenant(db, tenant_id=tenant_id), list_api_keys(db, tenant_id=tenant_id)

    try:
        tenant, keys = await run_in_threadpool(read)
    except ACTION_ERRORS:
        return RedirectResponse(f"{PREFIX}/tenants", status_code=303)
    return render(
        request, "keys.html", session, page="tenants", tenant=tenant, keys=keys, scopes=SCOPES, **context
    )


@router.get("/tenants/{tenant_id}/keys")
async def keys(tenant_id: DbId, request: Request, session: SignedIn, state: StateDep):
    """A tenant's keys: prefixes, scopes, when created, last used and revoked."""
    return await _keys_page(request, session, state, tenant_id)


@router.post("/tenants/{tenant_id}/keys")
async def create_key(tenant_id: DbId, request: Request, session: Change, state: StateDep):
    form = await request.form()
    try:
        body = ApiKeyCreate(
            name=str(form.get("name", "")).strip(), scopes=form.getlist("scopes") or ["inference"]
        )

        def write():
            with state.session_factory() as db:
                return admin_keys.create_key(tenant_id, body, db)

        created = await run_in_threadpool(write)
    except ACTION_ERRORS as exc:
        return await _keys_page(request, session, state, tenant_id, error=error_text(exc))
    return await _keys_page(request, session, state, tenant_id, created=created)


@router.post("/keys/{key_id}/revoke")
async def revoke_key(key_id: DbId, session: Change, request: Request, state: StateDep):
    try:
        with state.session_factory() as db:
            key = await admin_keys.revoke_key(key_id, db, state)
    except ACTION_ERRORS:
        return RedirectResponse(f"{PREFIX}/tenants", status_code=303)
    notice = f"Key {key.prefix} revoked: every replica refuses it within a second."
    return await _keys_page(request, session, state, key.tenant_id, notice=notice)


def _unknown_key(key_id: int | None) -> bool:
    """A ``key_id`` no row can have (the query string is not bounded as path ids are): the database
    would overflow on it, so it is treated as a key that does not exist."""
    return key_id is not None and not 1 <= key_id <= DB_ID_MAX


async def _quota_page(request: Request, session, state, tenant_id: int, key_id: int | None, **context):
    if _unknown_key(key_id):
        return RedirectResponse(f"{PREFIX}/tenants", status_code=303)

    def read():
        with state.session_factory() as db:
            tenant = get_tenant(db, tenant_id=tenant_id)
            if key_id is not None and get_api_key(db, key_id=key_id).tenant_id != tenant_id:
                raise ValueError("not this tenant's key")
            keys = list_api_keys(db, tenant_id=tenant_id, include_revoked=False)
            quota = (
                admin_quotas.get_tenant_quota(tenant_id, db)
                if key_id is None
                else admin_quotas.get_key_quota(key_id, db)
            )
            return tenant, keys, quota

    try:
        tenant, keys, quota = await run_in_threadpool(read)
    except ACTION_ERRORS:
        return RedirectResponse(f"{PREFIX}/tenants", status_code=303)
    try:
        with state.session_factory() as db:
            usage = await (
                admin_quotas.tenant_quota_usage(tenant_id, db, state)
                if key_id is None
                else admin_quotas.key_quota_usage(key_id, db, state)
            )
    except ACTION_ERRORS:  # quotas off on this gateway: no live usage to show
        usage = None
    return render(
        request,
        "quotas.html",
        session,
        page="tenants",
        tenant=tenant,
        keys=keys,
        key_id=key_id,
        quota=quota,
        usage=usage,
        limits=LIMITS,
        **context,
    )


@router.get("/tenants/{tenant_id}/quotas")
async def quotas(
    tenant_id: DbId, request: Request, session: SignedIn, state: StateDep, key_id: int | None = None
):
    """Every limit of a tenant (or of one of its keys) with the live usage beside it."""
    return await _quota_page(request, session, state, tenant_id, key_id)


@router.post("/tenants/{tenant_id}/quotas")
async def set_quota(
    tenant_id: DbId, request: Request, session: Change, state: StateDep, key_id: int | None = None
):
    if _unknown_key(key_id):
        return RedirectResponse(f"{PREFIX}/tenants", status_code=303)
    form = await request.form()
    try:
        body = QuotaSet(
            **{name: number(form, name, int) for name, _label, _usage in LIMITS},
            allowed_tiers=form.getlist("allowed_tiers") or None,
            tier_shares=tier_shares(form, state.settings.tiers),
        )
        with state.session_factory() as db:
            if key_id is None:
                await admin_quotas.set_tenant_quota(tenant_id, body, db, state)
            else:
                await admin_quotas.set_key_quota(key_id, body, db, state)
    except ACTION_ERRORS as exc:
        return await _quota_page(request, session, state, tenant_id, key_id, error=error_text(exc))
    return await _quota_page(request, session, state, tenant_id, key_id, notice="Quota saved: in force now.")
