"""Database engine, sessions and programmatic Alembic migrations.

SQLite by default (``sqlite:///fairlane.db``), PostgreSQL by URL
(``postgresql+psycopg://user@host:5432/db``). The Alembic configuration lives here in code; the
scripts live in the top-level ``migrations`` package, found without importing it.
"""

from __future__ import annotations

import fcntl
import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, Select, create_engine, event, make_url
from sqlalchemy.orm import Session, sessionmaker

DEFAULT_DATABASE_URL = "sqlite:///fairlane.db"


SQLITE_BUSY_S = 30  # a writer waits this long for another process's write (several gateways, one file)


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    """Foreign keys on; write-ahead log (readers never block the writer, so gateways and serve's
    processes sharing one file do not fail with "database is locked") with fsync at checkpoints
    only (synchronous=NORMAL): a commit (the gateway writes a usage row before each response) costs
    about 1 ms instead of an fsync of tens of ms; a power cut may lose the last commits, never the
    database."""
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def page(query: Select[Any], id_column: Any, *, after: int | None, limit: int | None) -> Select[Any]:
    """``query`` (ordered by ``id_column``) from the id after ``after``, at most ``limit`` rows
    (None: from the first, every row)."""
    if after is not None:
        query = query.where(id_column > after)
    return query.limit(limit)


def make_engine(url: str = DEFAULT_DATABASE_URL, **kwargs: Any) -> Engine:
    """An Engine for ``url``; SQLite gets foreign keys on, a write-ahead log, and may be shared
    across threads."""
    if url.startswith("sqlite"):
        kwargs.setdefault("connect_args", {"check_same_thread": False, "timeout": SQLITE_BUSY_S})
        engine = create_engine(url, **kwargs)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    kwargs.setdefault("pool_pre_ping", True)
    return create_engine(url, **kwargs)


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(bind=engine, expire_on_commit=False)


def migrations_dir() -> Path:
    spec = importlib.util.find_spec("migrations")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the 'migrations' package is not installed next to 'tenancy'")
    return Path(next(iter(spec.submodule_search_locations)))


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    # '%' is ConfigParser's interpolation character; URLs may carry it (escaped passwords).
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


@contextmanager
def _sqlite_migration_lock(url: str) -> Iterator[None]:
    """Serialize migrations of one SQLite file across processes (PostgreSQL uses an advisory lock
    in migrations/env.py)."""
    database = make_url(url).database if url.startswith("sqlite") else None
    if not database or database == ":memory:":
        yield
        return
    with open(f"{database}.migrate-lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def upgrade(url: str = DEFAULT_DATABASE_URL, revision: str = "head") -> None:
    """Apply migrations up to ``revision`` (the latest by default); safe to run from many processes."""
    with _sqlite_migration_lock(url):
        command.upgrade(alembic_config(url), revision)


def downgrade(url: str = DEFAULT_DATABASE_URL, revision: str = "base") -> None:
    """Revert migrations down to ``revision`` (an empty schema by default)."""
    command.downgrade(alembic_config(url), revision)


def current_revision(url: str) -> str | None:
    from alembic.runtime.migration import MigrationContext

    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()
    finally:
        engine.dispose()
