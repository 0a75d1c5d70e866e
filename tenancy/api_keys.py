"""API key CRUD and authentication: the full key is returned by create_api_key and never again."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from tenancy.db import page
from tenancy.errors import NotFoundError, ValidationError
from tenancy.keys import generate_key, key_prefix, verify_key
from tenancy.models import ApiKey, Tenant, utcnow
from tenancy.tenants import get_tenant

# what a key may do: call the OpenAI API (/v1), and manage its own tenant's LoRA adapters
INFERENCE_SCOPE, ADAPTER_SCOPE = "inference", "adapters"
SCOPES = (INFERENCE_SCOPE, ADAPTER_SCOPE)
DEFAULT_SCOPES = (INFERENCE_SCOPE,)


@dataclass(frozen=True)
class CreatedApiKey:
    """The stored row and the one-time plaintext key."""

    api_key: ApiKey
    key: str


def create_api_key(
    session: Session, *, tenant_id: int, name: str = "", scopes: Sequence[str] = DEFAULT_SCOPES
) -> CreatedApiKey:
    unknown = sorted(set(scopes) - set(SCOPES))
    if unknown:
        raise ValidationError(
            f"unknown scopes {unknown}: a key's scopes are among {list(SCOPES)}", param="scopes"
        )
    if not scopes:  # a key that may do nothing: revoking is how a key is stopped
        raise ValidationError(f"a key needs at least one scope, among {list(SCOPES)}", param="scopes")
    twice = sorted({scope for scope in scopes if list(scopes).count(scope) > 1})
    if twice:  # stored as given, twice, before: a list of scopes is a set
        raise ValidationError(f"scopes names {twice[0]!r} more than once", param="scopes")
    get_tenant(session, tenant_id=tenant_id)
    while True:  # a prefix collision is astronomically rare (62**8); draw again if it happens
        generated = generate_key()
        if session.scalar(select(ApiKey.id).where(ApiKey.prefix == generated.prefix)) is None:
            break
    row = ApiKey(
        tenant_id=tenant_id,
        prefix=generated.prefix,
        secret_hash=generated.secret_hash,
        name=name,
        scopes=list(scopes),
    )
    session.add(row)
    session.commit()
    return CreatedApiKey(api_key=row, key=generated.key)


def list_api_keys(
    session: Session,
    *,
    tenant_id: int,
    include_revoked: bool = True,
    after: int | None = None,
    limit: int | None = None,
) -> list[ApiKey]:
    """A tenant's keys by id; ``after``: only those with a greater id; ``limit``: at most that many."""
    get_tenant(session, tenant_id=tenant_id)
    query = select(ApiKey).where(ApiKey.tenant_id == tenant_id).order_by(ApiKey.id)
    if not include_revoked:
        query = query.where(ApiKey.revoked_at.is_(None))
    return list(session.scalars(page(query, ApiKey.id, after=after, limit=limit)))


def get_api_key(session: Session, *, key_id: int) -> ApiKey:
    row = session.get(ApiKey, key_id)
    if row is None:
        raise NotFoundError(f"API key {key_id} not found", param="key_id")
    return row


def revoke_api_key(session: Session, *, key_id: int) -> ApiKey:
    """Mark a key revoked (idempotent: the first revocation time is kept)."""
    row = get_api_key(session, key_id=key_id)
    if row.revoked_at is None:
        row.revoked_at = utcnow()
        session.commit()
    return row


def authenticate_key(session: Session, *, key: str, active_only: bool = True) -> tuple[ApiKey, Tenant] | None:
    """The key's row and tenant if the key is ours, unrevoked and its tenant active (any tenant
    with ``active_only`` false: the caller says why it refuses); else None."""
    prefix = key_prefix(key)
    if prefix is None:
        return None
    row = session.scalar(select(ApiKey).where(ApiKey.prefix == prefix))
    if row is None or not verify_key(key, row.secret_hash) or row.revoked:
        return None
    tenant = row.tenant
    if active_only and not tenant.active:
        return None
    return row, tenant


def touch_api_key(session: Session, *, key_id: int) -> None:
    """Record that a key was used now (one UPDATE; callers throttle how often)."""
    session.execute(update(ApiKey).where(ApiKey.id == key_id).values(last_used_at=utcnow()))
    session.commit()
