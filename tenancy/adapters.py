"""Adapter rows: a tenant's LoRA adapters by name, each pointing at its files by content digest.

The files themselves (validation, the content-addressed store) are the gateway's; these functions
keep only the rows and answer whether a digest is still used by any row.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from tenancy.db import page
from tenancy.errors import ConflictError, NotFoundError, ValidationError
from tenancy.models import Adapter
from tenancy.tenants import get_tenant


def create_adapter(
    session: Session,
    *,
    tenant_id: int,
    name: str,
    sha256: str,
    rank: int,
    alpha: float,
    target_modules: list[str],
    size_bytes: int,
) -> Adapter:
    """Insert an adapter row; ConflictError when the tenant already has an adapter of that name."""
    if rank <= 0:
        raise ValidationError("rank must be positive", param="rank")
    if len(sha256) != 64:
        raise ValidationError("sha256 must be a hex digest of 64 characters", param="sha256")
    get_tenant(session, tenant_id=tenant_id)
    if get_adapter(session, tenant_id=tenant_id, name=name, missing_ok=True) is not None:
        raise _duplicate(tenant_id, name)
    row = Adapter(
        tenant_id=tenant_id,
        name=name,
        sha256=sha256,
        rank=rank,
        alpha=alpha,
        target_modules=list(target_modules),
        size_bytes=size_bytes,
    )
    session.add(row)
    try:
        session.commit()
    except IntegrityError:  # a concurrent upload of the same name won
        session.rollback()
        raise _duplicate(tenant_id, name) from None
    return row


def _duplicate(tenant_id: int, name: str) -> ConflictError:
    return ConflictError(f"adapter {name!r} already exists for tenant {tenant_id}", param="name")


def get_adapter(session: Session, *, tenant_id: int, name: str, missing_ok: bool = False) -> Adapter | None:
    """A tenant's adapter by name."""
    row = session.scalar(select(Adapter).where(Adapter.tenant_id == tenant_id, Adapter.name == name))
    if row is None and not missing_ok:
        raise NotFoundError(f"adapter {name!r} not found", param="name")
    return row


def get_adapter_by_id(session: Session, *, adapter_id: int, tenant_id: int | None = None) -> Adapter:
    """An adapter by id; with ``tenant_id``, another tenant's adapter is as missing as an absent one."""
    row = session.get(Adapter, adapter_id)
    if row is None or (tenant_id is not None and row.tenant_id != tenant_id):
        raise NotFoundError(f"adapter {adapter_id} not found", param="adapter_id")
    return row


def list_adapters(
    session: Session, *, tenant_id: int, after: int | None = None, limit: int | None = None
) -> list[Adapter]:
    """A tenant's adapters by id; ``after``: only those with a greater id; ``limit``: at most that many."""
    query = select(Adapter).where(Adapter.tenant_id == tenant_id).order_by(Adapter.id)
    return list(session.scalars(page(query, Adapter.id, after=after, limit=limit)))


def delete_adapter(session: Session, *, adapter_id: int, tenant_id: int | None = None) -> Adapter:
    """Delete an adapter row (see get_adapter_by_id for ``tenant_id``); returns the deleted row."""
    row = get_adapter_by_id(session, adapter_id=adapter_id, tenant_id=tenant_id)
    session.delete(row)
    session.commit()
    return row


def digest_in_use(session: Session, *, sha256: str) -> bool:
    """Whether any adapter row still points at the files of this digest."""
    return session.scalar(select(Adapter.id).where(Adapter.sha256 == sha256).limit(1)) is not None
