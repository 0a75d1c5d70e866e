"""Quota rows: one per tenant (key_id None) and optionally one per key; NULL limits are unlimited."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from tenancy.errors import ValidationError
from tenancy.models import Quota
from tenancy.tenants import check_distinct_tiers, get_tenant

QUOTA_FIELDS = (
    "requests_per_minute",
    "tokens_per_minute",
    "max_concurrency",
    "daily_token_budget",
    "monthly_token_budget",
    "max_tokens_per_request",
    "allowed_tiers",
    "tier_shares",
)


def get_quota(session: Session, *, tenant_id: int, key_id: int | None = None) -> Quota | None:
    query = select(Quota).where(Quota.tenant_id == tenant_id)
    query = query.where(Quota.key_id.is_(None) if key_id is None else Quota.key_id == key_id)
    return session.scalar(query)


def set_quota(session: Session, *, tenant_id: int, key_id: int | None = None, **limits: Any) -> Quota:
    """Create or replace the quota row for a tenant (or one of its keys); omitted limits become NULL."""
    unknown = set(limits) - set(QUOTA_FIELDS)
    if unknown:
        raise ValidationError(f"unknown quota fields: {sorted(unknown)}", param=sorted(unknown)[0])
    for name, value in limits.items():
        if isinstance(value, int) and value < 0:
            raise ValidationError(f"{name} must not be negative", param=name)
    check_distinct_tiers(limits.get("allowed_tiers"))
    get_tenant(session, tenant_id=tenant_id)
    row = get_quota(session, tenant_id=tenant_id, key_id=key_id)
    if row is None:
        row = Quota(tenant_id=tenant_id, key_id=key_id)
        session.add(row)
    for name in QUOTA_FIELDS:
        setattr(row, name, limits.get(name))
    session.commit()
    return row


def list_quotas(session: Session, *, tenant_id: int) -> list[Quota]:
    return list(session.scalars(select(Quota).where(Quota.tenant_id == tenant_id).order_by(Quota.id)))


def tenant_quotas(session: Session) -> dict[int, Quota]:
    """Every tenant's own quota row (not its keys'), by tenant id: one query."""
    return {row.tenant_id: row for row in session.scalars(select(Quota).where(Quota.key_id.is_(None)))}
