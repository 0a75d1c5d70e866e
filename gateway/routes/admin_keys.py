"""Admin REST for API keys (create, list, revoke) and per-tenant usage reports."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from gateway.deps import AdminDep, SessionDep, StateDep
from gateway.errors import UnprocessableEntity
from gateway.schemas.admin import ApiKeyCreate, ApiKeyCreated, ApiKeyPublic, ApiKeysPublic, UsagePublic
from tenancy import create_api_key, get_api_key, get_tenant, list_api_keys, revoke_api_key, usage_summary

router = APIRouter(prefix="/admin", tags=["admin: keys and usage"], dependencies=[AdminDep])


@router.post("/tenants/{tenant_id}/keys", status_code=201, response_model=ApiKeyCreated)
async def create_key(tenant_id: int, body: ApiKeyCreate, session: SessionDep):
    """Create an API key; the response holds the secret, shown this once and never again."""
    created = await run_in_threadpool(lambda: create_api_key(session, tenant_id=tenant_id, **body.model_dump()))
    return ApiKeyCreated(**ApiKeyPublic.model_validate(created.api_key).model_dump(), key=created.key)


@router.get("/tenants/{tenant_id}/keys", response_model=ApiKeysPublic)
async def list_keys(tenant_id: int, session: SessionDep, include_revoked: bool = True):
    """List a tenant's keys (prefixes only)."""
    keys = await run_in_threadpool(
        lambda: list_api_keys(session, tenant_id=tenant_id, include_revoked=include_revoked)
    )
    return ApiKeysPublic(data=[ApiKeyPublic.model_validate(k) for k in keys], count=len(keys))


@router.post("/keys/{key_id}/revoke", response_model=ApiKeyPublic)
async def revoke_key(key_id: int, session: SessionDep, state: StateDep):
    """Revoke a key: every replica refuses it within 1 s."""
    key = await run_in_threadpool(lambda: revoke_api_key(session, key_id=key_id))
    await state.key_cache.invalidate()
    return key


@router.get("/keys/{key_id}", response_model=ApiKeyPublic)
async def get_key(key_id: int, session: SessionDep):
    """Get one key (prefix and dates, never the secret)."""
    return await run_in_threadpool(lambda: get_api_key(session, key_id=key_id))


@router.get("/tenants/{tenant_id}/usage", response_model=UsagePublic)
async def usage(tenant_id: int, session: SessionDep, since: datetime | None = None, until: datetime | None = None):
    """Usage of a tenant in [since, until) (default: the last 30 days), by model and by tier."""
    until = _aware(until) or datetime.now(timezone.utc)
    since = _aware(since) or until - timedelta(days=30)
    if since >= until:
        raise UnprocessableEntity("'since' must be before 'until'.", param="since")

    def summarize():
        get_tenant(session, tenant_id=tenant_id)
        return usage_summary(session, tenant_id=tenant_id, since=since, until=until)

    summary = await run_in_threadpool(summarize)

    def totals(t):
        return {"requests": t.requests, "prompt_tokens": t.prompt_tokens,
                "completion_tokens": t.completion_tokens, "total_tokens": t.total_tokens}

    return UsagePublic(
        tenant_id=tenant_id, since=since, until=until, totals=totals(summary.totals),
        by_model={k: totals(v) for k, v in summary.by_model.items()},
        by_tier={k: totals(v) for k, v in summary.by_tier.items()},
    )


def _aware(value: datetime | None) -> datetime | None:
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value
