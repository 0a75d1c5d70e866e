"""Alembic environment: online migrations against the URL set by tenancy.db.alembic_config."""

from __future__ import annotations

from alembic import context
from sqlalchemy import pool

from tenancy.db import make_engine
from tenancy.models import Base

target_metadata = Base.metadata


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
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise RuntimeError("fairlane runs migrations online only (tenancy.db.upgrade)")
run_migrations_online()
