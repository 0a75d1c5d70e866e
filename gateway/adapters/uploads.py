"""An adapter upload, all or nothing: check the name, validate the files against the served model,
store them (content-addressed), then insert the row. A refusal at any step leaves no file and no
row behind (the files of a digest are removed unless another row uses them)."""

from __future__ import annotations

from typing import BinaryIO

from sqlalchemy.orm import Session, sessionmaker

from engine.lora import ModelShape
from gateway.adapters.store import AdapterStore
from gateway.adapters.validate import inspect_upload
from tenancy import (
    Adapter,
    ConflictError,
    create_adapter,
    delete_adapter,
    digest_in_use,
    get_adapter,
    get_tenant,
)


def store_adapter(
    session_factory: sessionmaker[Session],
    store: AdapterStore,
    *,
    tenant_id: int,
    name: str,
    config: bytes,
    weights: BinaryIO,
    weights_size: int,
    shape: ModelShape,
    max_rank: int,
) -> Adapter:
    """Validate and keep an uploaded adapter (blocking: run in a thread). Raises tenancy's
    NotFoundError / ConflictError, or the engine's AdapterError naming what is wrong."""
    with session_factory() as session:
        get_tenant(session, tenant_id=tenant_id)
        if get_adapter(session, tenant_id=tenant_id, name=name, missing_ok=True) is not None:
            raise ConflictError(f"adapter {name!r} already exists for tenant {tenant_id}", param="name")
    spec = inspect_upload(config, weights, weights_size, shape, max_rank)
    digest = store.put(config, weights)
    try:
        with session_factory() as session:
            row = create_adapter(
                session,
                tenant_id=tenant_id,
                name=name,
                sha256=digest,
                rank=spec.rank,
                alpha=spec.alpha,
                target_modules=list(spec.target_modules),
                size_bytes=spec.size_bytes,
            )
    except BaseException:
        forget_files(session_factory, store, digest)
        raise
    if not store.exists(digest):  # a delete of another row with the same files removed them meanwhile
        store.put(config, weights)
    return row


def remove_adapter(
    session_factory: sessionmaker[Session], store: AdapterStore, *, adapter_id: int, tenant_id: int | None
) -> Adapter:
    """Delete the row, then its files unless another row uses them. Requests already running with
    it finish (their worker holds the weights); later ones no longer find it."""
    with session_factory() as session:
        row = delete_adapter(session, adapter_id=adapter_id, tenant_id=tenant_id)
    forget_files(session_factory, store, row.sha256)
    return row


def forget_files(session_factory: sessionmaker[Session], store: AdapterStore, digest: str) -> None:
    if not digest:  # a row from before the store (migration 0003) has no files
        return
    with session_factory() as session:
        if not digest_in_use(session, sha256=digest):
            store.remove(digest)
