"""Alembic environment: online migrations against the URL set by tenancy.db.alembic_config."""

from __future__ import annotations

from alembic import context
from sqlalchemy import pool, text

from tenancy.db import make_engine
from tenancy.models import Base

target_metadata = Base.metadata
MIGRATION_LOCK_KEY = 0x66616972  # "fair": one advisory lock id for fairlane's migrations


def run_migrations_online() -> None:
    url = context.config.get_main_option("sqlalchemy.url")
    engine = make_engine(url, poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            context.configure(
                connection=connection,
                target_metadata=target_metadata,
                render_as_batch=connection.dialect.name == "sqlite",
                compare_type=True,
            )
            with context.begin_transaction():
                if connection.dialect.name == "postgresql":
                    # Gateways starting together migrate one at a time; the others then find head.
                    connection.execute(
                        text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY}
                    )
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise RuntimeError("fairlane runs migrations online only (tenancy.db.upgrade)")
run_migrations_online()
