"""Adapter rows: a tenant's LoRA adapters by name (the LoRA issue fills in uploads and loading)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from tenancy.errors import ConflictError, NotFoundError, ValidationError
from tenancy.models import Adapter
from tenancy.tenants import get_tenant


def create_adapter(session: Session, *, tenant_id: int, name: str, path: str, rank: int) -> Adapter:
    if rank <= 0:
        raise ValidationError("rank must be positive", param="rank")
    get_tenant(session, tenant_id=tenant_id)
    if get_adapter(session, tenant_id=tenant_id, name=name, missing_ok=True) is not None:
        raise ConflictError(f"adapter {name!r} already exists for tenant {tenant_id}", param="name")
    row = Adapter(tenant_id=tenant_id, name=name, path=path, rank=rank)
    session.add(row)
    session.commit()
    return row


def get_adapter(session: Session, *, tenant_id: int, name: str, missing_ok: bool = False) -> Adapter | None:
    row = session.scalar(select(Adapter).where(Adapter.tenant_id == tenant_id, Adapter.name == name))
    if row is None and not missing_ok:
        raise NotFoundError(f"adapter {name!r} not found", param="name")
    return row


def list_adapters(session: Session, *, tenant_id: int) -> list[Adapter]:
    return list(session.scalars(select(Adapter).where(Adapter.tenant_id == tenant_id).order_by(Adapter.id)))


def delete_adapter(session: Session, *, tenant_id: int, name: str) -> None:
    row = get_adapter(session, tenant_id=tenant_id, name=name)
    session.delete(row)
    session.commit()
