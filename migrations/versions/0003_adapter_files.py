"""adapters: content-addressed files (sha256) and the adapter's rank, alpha, target modules, size

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 08:00:00

Rows of 0002 named a folder (``path``); from here an adapter's files live in the adapter store
under their content digest, which a row of 0002 does not have: those rows are kept with an empty
digest (the gateway answers 404 for them) and their ``path`` is dropped.
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

NEW_COLUMNS = (
    ("sha256", sa.String(length=64), ""),
    ("alpha", sa.Float(), "0"),
    ("target_modules", sa.JSON(), "[]"),
    ("size_bytes", sa.BigInteger(), "0"),
)


def upgrade() -> None:
    with op.batch_alter_table("adapters") as batch:
        for name, kind, default in NEW_COLUMNS:
            batch.add_column(sa.Column(name, kind, nullable=False, server_default=default))
        batch.drop_column("path")
    with op.batch_alter_table("adapters") as batch:  # the defaults were for existing rows only
        for name, kind, _default in NEW_COLUMNS:
            batch.alter_column(name, existing_type=kind, existing_nullable=False, server_default=None)
        batch.create_index(batch.f("ix_adapters_sha256"), ["sha256"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("adapters") as batch:
        batch.drop_index(batch.f("ix_adapters_sha256"))
        batch.add_column(sa.Column("path", sa.String(length=1024), nullable=False, server_default=""))
        for name, _kind, _default in reversed(NEW_COLUMNS):
            batch.drop_column(name)
    with op.batch_alter_table("adapters") as batch:
        batch.alter_column(
            "path", existing_type=sa.String(length=1024), existing_nullable=False, server_default=None
        )
