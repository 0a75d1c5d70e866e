"""Console pages for tenants: list and create; edit weight, tiers, tier shares and latency targets;
disable and enable. Changes go through the admin REST handlers (gateway/api/routes), so they check
and propagate exactly as the REST API does."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse
from starlette.concurrency import run_in_threadpool

from gateway.api.deps import StateDep
from gateway.api.routes import admin_quotas, admin_tenants
from gateway.api.schemas.admin import DbId, TenantCreate, TenantUpdate
from gateway.api.schemas.quotas import QuotaPublic, QuotaSet
from gateway.console.session import PREFIX, Change, SignedIn
from gateway.console.views import ACTION_ERRORS, error_text, number, render, tier_shares
from tenancy import TENANT_ACTIVE, TENANT_DISABLED, get_quota, get_tenant, list_tenants, tenant_quotas

router = APIRouter()


def _quota_of(db, tenant_id: int) -> QuotaPublic | None:
    row = get_quota(db, tenant_id=tenant_id)
    return QuotaPublic.model_validate(row) if row is not None else None


async def _list_page(request: Request, session, state, **context):
    def read():
        with state.session_factory() as db:
            quotas = {t: QuotaPublic.model_validate(q) for t, q in tenant_quotas(db).items()}
            return list_tenants(db), quotas

    tenants, quotas = await run_in_threadpool(read)
    return render(request, "tenants.html", session, page="tenants", tenants=tenants, quotas=quotas, **context)


@router.get("/tenants")
async def tenants(request: Request, session: SignedIn, state: StateDep):
    """Every tenant, and a form to create one."""
    return await _list_page(request, session, state)


@router.post("/tenants")
async def create(request: Request, session: Change, state: StateDep):
    form = await request.form()
    try:
        body = TenantCreate(
            name=str(form.get("name", "")).strip(),
            weight=number(form, "weight") or 1.0,
            default_tier=str(form.get("default_tier") or "standard"),
            allowed_tiers=form.getlist("allowed_tiers") or [str(form.get("default_tier") or "standard")],
            ttft_target_s=number(form, "ttft_target_s"),
            tpot_target_s=number(form, "tpot_target_s"),
        )

        def write():
            with state.session_factory() as db:
                return admin_tenants.create(body, db, state)

        tenant = await run_in_threadpool(write)
    except ACTION_ERRORS as exc:
        return await _list_page(request, session, state, error=error_text(exc))
    return await _list_page(request, session, state, notice=f"Tenant {tenant.name!r} created.")


async def _edit_page(request: Request, session, state, tenant_id: int, **context):
    def read():
        with state.session_factory() as db:
            return get_tenant(db, tenant_id=tenant_id), _quota_of(db, tenant_id)

    try:
        tenant, quota = await run_in_threadpool(read)
    except ACTION_ERRORS:
        return RedirectResponse(f"{PREFIX}/tenants", status_code=303)
    return render(request, "tenant.html", session, page="tenants", tenant=tenant, quota=quota, **context)


@router.get("/tenants/{tenant_id}")
async def edit(tenant_id: DbId, request: Request, session: SignedIn, state: StateDep):
    """One tenant's settings."""
    return await _edit_page(request, session, state, tenant_id)


@router.post("/tenants/{tenant_id}")
async def update(tenant_id: DbId, request: Request, session: Change, state: StateDep):
    form = await request.form()
    try:
        body = TenantUpdate(
            weight=number(form, "weight"),
            default_tier=str(form.get("default_tier") or "") or None,
            allowed_tiers=form.getlist("allowed_tiers") or None,
            ttft_target_s=number(form, "ttft_target_s"),
            tpot_target_s=number(form, "tpot_target_s"),
        )
        shares = tier_shares(form, state.settings.tiers)

        with state.session_factory() as db:
            await admin_tenants.update(tenant_id, body, db, state)
            quota = await run_in_threadpool(_quota_of, db, tenant_id)
            current = quota.tier_shares if quota is not None else None
            if shares != current:  # tier shares live in the tenant's quota: keep its other limits
                limits = quota.model_dump(include=set(QuotaSet.model_fields)) if quota is not None else {}
                await admin_quotas.set_tenant_quota(
                    tenant_id, QuotaSet(**{**limits, "tier_shares": shares}), db, state
                )
    except ACTION_ERRORS as exc:
        return await _edit_page(request, session, state, tenant_id, error=error_text(exc))
    return await _edit_page(request, session, state, tenant_id, notice="Saved.")


@router.post("/tenants/{tenant_id}/status")
async def set_status(tenant_id: DbId, request: Request, session: Change, state: StateDep):
    form = await request.form()
    status = TENANT_DISABLED if form.get("status") == TENANT_DISABLED else TENANT_ACTIVE
    try:
        with state.session_factory() as db:
            await admin_tenants.update(tenant_id, TenantUpdate(status=status), db, state)
    except ACTION_ERRORS as exc:
        return await _edit_page(request, session, state, tenant_id, error=error_text(exc))
    done = "disabled: its keys are refused" if status == TENANT_DISABLED else "enabled"
    return await _edit_page(request, session, state, tenant_id, notice=f"Tenant {done}.")
