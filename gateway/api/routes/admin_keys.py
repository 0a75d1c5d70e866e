"""Admin REST for API keys (create, list, revoke) and per-tenant usage reports.

Routes that only touch the database are plain ``def`` (FastAPI runs them in its thread pool);
revoking also tells every replica to drop cached keys (a Redis call), so it is ``async``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from gateway.api.deps import AdminDep, SessionDep, StateDep
from gateway.api.errors import ADMIN_ERROR_RESPONSES, UnprocessableEntity
from gateway.api.schemas.admin import (
    ApiKeyCreate,
    ApiKeyCreated,
    ApiKeyPublic,
    ApiKeysPublic,
    DbId,
    PageAfter,
    PageLimit,
    UsagePublic,
    fetch_limit,
    page_of,
)
from tenancy import create_api_key, get_api_key, get_tenant, list_api_keys, revoke_api_key, usage_summary

router = APIRouter(
    prefix="/admin", tags=["admin: keys and usage"], dependencies=[AdminDep], responses=ADMIN_ERROR_RESPONSES
)
USAGE_WINDOW_DAYS = 30  # a usage report without 'since' covers this many days


@router.post("/tenants/{tenant_id}/keys", status_code=201, response_model=ApiKeyCreated)
def create_key(tenant_id: DbId, body: ApiKeyCreate, session: SessionDep):
    """Create an API key; the response holds the secret, shown this once and never again."""
    created = create_api_key(session, tenant_id=tenant_id, **body.model_dump())
    return ApiKeyCreated(**ApiKeyPublic.model_validate(created.api_key).model_dump(), key=created.key)


@router.get("/tenants/{tenant_id}/keys", response_model=ApiKeysPublic)
def list_keys(
    tenant_id: DbId,
    session: SessionDep,
    include_revoked: bool = True,
    limit: PageLimit = None,
    after: PageAfter = None,
):
    """List a tenant's keys (prefixes only) by id, all or a page (``limit``, ``after``)."""
    rows = list_api_keys(
        session, tenant_id=tenant_id, include_revoked=include_revoked, after=after, limit=fetch_limit(limit)
    )
    page, more = page_of(rows, limit)
    return ApiKeysPublic(data=[ApiKeyPublic.model_validate(k) for k in page], count=len(page), has_more=more)


@router.post("/keys/{key_id}/revoke", response_model=ApiKeyPublic)
async def revoke_key(key_id: DbId, session: SessionDep, state: StateDep):
    """Revoke a key: every replica refuses it within 1 s."""
    key = await run_in_threadpool(lambda: revoke_api_key(session, key_id=key_id))
    await state.key_cache.invalidate()
    return key


@router.get("/keys/{key_id}", response_model=ApiKeyPublic)
def get_key(key_id: DbId, session: SessionDep):
    """Get one key (prefix and dates, never the secret)."""
    return get_api_key(session, key_id=key_id)


@router.get("/tenants/{tenant_id}/usage", response_model=UsagePublic)
def usage(tenant_id: DbId, session: SessionDep, since: datetime | None = None, until: datetime | None = None):
    """Usage of a tenant in [since, until) (default: the last 30 days), by model and by tier."""
    until = _aware(until) or datetime.now(UTC)
    try:
        since = _aware(since) or until - timedelta(days=USAGE_WINDOW_DAYS)
    except OverflowError:  # an 'until' in the first 30 days of year 1
        raise UnprocessableEntity("'until' is out of range.", param="until") from None
    if since >= until:
        raise UnprocessableEntity("'since' must be before 'until'.", param="since")
    get_tenant(session, tenant_id=tenant_id)
    summary = usage_summary(session, tenant_id=tenant_id, since=since, until=until)

    def totals(t):
        return {
            "requests": t.requests,
            "prompt_tokens": t.prompt_tokens,
            "completion_tokens": t.completion_tokens,
            "total_tokens": t.total_tokens,
        }

    return UsagePublic(
        tenant_id=tenant_id,
        since=since,
        until=until,
        totals=totals(summary.totals),
        by_model={k: totals(v) for k, v in summary.by_model.items()},
        by_tier={k: totals(v) for k, v in summary.by_tier.items()},
    )


def _aware(value: datetime | None) -> datetime | None:
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value
