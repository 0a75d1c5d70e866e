"""Tenant CRUD: keyword-only functions over a Session; each commits its own change."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import cast

from sqlalchemy import select
from sqlalchemy.orm import Session

from tenancy.db import page
from tenancy.errors import ConflictError, NotFoundError, ValidationError
from tenancy.models import TENANT_ACTIVE, TENANT_DISABLED, Tenant

DEFAULT_ALLOWED_TIERS = ("standard", "batch")
MIN_WEIGHT, MAX_WEIGHT = 0.01, 100.0  # fair-share weights: a 10^4 spread, no underflow
_UNSET = object()


def _check_tiers(default_tier: str, allowed_tiers: Sequence[str]) -> None:
    if not allowed_tiers:
        raise ValidationError("allowed_tiers must not be empty", param="allowed_tiers")
    if default_tier not in allowed_tiers:
        raise ValidationError(
            f"default_tier {default_tier!r} is not in allowed_tiers {list(allowed_tiers)}",
            param="default_tier",
        )


def check_distinct_tiers(allowed_tiers: Sequence[str] | None) -> None:
    """Refuse a tier named twice (it was stored as given, twice): a list of tiers is a set."""
    if allowed_tiers is None:
        return
    seen: set[str] = set()
    for tier in allowed_tiers:
        if tier in seen:
            raise ValidationError(f"allowed_tiers names {tier!r} more than once", param="allowed_tiers")
        seen.add(tier)


def _check_target(value: float | None, param: str) -> None:
    if value is not None and not (0 < value < math.inf):  # NaN fails too
        raise ValidationError(f"{param} must be a positive, finite number of seconds", param=param)


def _check_weight(weight: float) -> None:
    """A fair-share weight the engine can divide by: positive and finite (NaN is neither)."""
    if not (MIN_WEIGHT <= weight <= MAX_WEIGHT):
        raise ValidationError(f"weight must be between {MIN_WEIGHT} and {MAX_WEIGHT}", param="weight")


def create_tenant(
    session: Session,
    *,
    name: str,
    weight: float = 1.0,
    default_tier: str = "standard",
    allowed_tiers: Sequence[str] = DEFAULT_ALLOWED_TIERS,
    ttft_target_s: float | None = None,
    tpot_target_s: float | None = None,
) -> Tenant:
    """A new tenant; its latency targets (seconds), when given, replace its tiers' for its requests."""
    _check_weight(weight)
    check_distinct_tiers(allowed_tiers)
    _check_tiers(default_tier, allowed_tiers)
    _check_target(ttft_target_s, "ttft_target_s")
    _check_target(tpot_target_s, "tpot_target_s")
    if session.scalar(select(Tenant.id).where(Tenant.name == name)) is not None:
        raise ConflictError(f"tenant {name!r} already exists", param="name")
    tenant = Tenant(
        name=name,
        weight=weight,
        default_tier=default_tier,
        allowed_tiers=list(allowed_tiers),
        ttft_target_s=ttft_target_s,
        tpot_target_s=tpot_target_s,
    )
    session.add(tenant)
    session.commit()
    return tenant


def list_tenants(
    session: Session, *, include_disabled: bool = True, after: int | None = None, limit: int | None = None
) -> list[Tenant]:
    """Tenants by id; ``after``: only those with a greater id; ``limit``: at most that many."""
    query = select(Tenant).order_by(Tenant.id)
    if not include_disabled:
        query = query.where(Tenant.status == TENANT_ACTIVE)
    return list(session.scalars(page(query, Tenant.id, after=after, limit=limit)))


def get_tenant(session: Session, *, tenant_id: int) -> Tenant:
    tenant = session.get(Tenant, tenant_id)
    if tenant is None:
        raise NotFoundError(f"tenant {tenant_id} not found", param="tenant_id")
    return tenant


def get_tenant_by_name(session: Session, *, name: str) -> Tenant:
    tenant = session.scalar(select(Tenant).where(Tenant.name == name))
    if tenant is None:
        raise NotFoundError(f"tenant {name!r} not found", param="name")
    return tenant


def update_tenant(
    session: Session,
    *,
    tenant_id: int,
    name: str | None = None,
    weight: float | None = None,
    default_tier: str | None = None,
    allowed_tiers: Sequence[str] | None = None,
    status: str | None = None,
    ttft_target_s: float | None | object = _UNSET,
    tpot_target_s: float | None | object = _UNSET,
) -> Tenant:
    """Change the given fields; None leaves a field as it is, except the latency targets, where
    None clears the tenant's own target (its tier's applies again) and leaving them out keeps them."""
    tenant = get_tenant(session, tenant_id=tenant_id)
    for param, value in (("ttft_target_s", ttft_target_s), ("tpot_target_s", tpot_target_s)):
        if value is not _UNSET:
            _check_target(cast("float | None", value), param)
            setattr(tenant, param, value)
    if name is not None and name != tenant.name:
        if session.scalar(select(Tenant.id).where(Tenant.name == name)) is not None:
            raise ConflictError(f"tenant {name!r} already exists", param="name")
        tenant.name = name
    if weight is not None:
        _check_weight(weight)
        tenant.weight = weight
    if status is not None:
        if status not in (TENANT_ACTIVE, TENANT_DISABLED):
            raise ValidationError(f"status must be {TENANT_ACTIVE!r} or {TENANT_DISABLED!r}", param="status")
        tenant.status = status
    check_distinct_tiers(allowed_tiers)  # only a new list: one stored before this check stays usable
    new_default = default_tier if default_tier is not None else tenant.default_tier
    new_allowed = list(allowed_tiers) if allowed_tiers is not None else list(tenant.allowed_tiers)
    _check_tiers(new_default, new_allowed)
    tenant.default_tier, tenant.allowed_tiers = new_default, new_allowed
    session.commit()
    return tenant


def disable_tenant(session: Session, *, tenant_id: int) -> Tenant:
    """Disable a tenant: its keys stop authenticating; its data stays."""
    return update_tenant(session, tenant_id=tenant_id, status=TENANT_DISABLED)
