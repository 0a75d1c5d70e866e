"""tenants: their own latency targets (ttft_target_s, tpot_target_s), over their tiers'

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23 10:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tenants") as batch:
        batch.add_column(sa.Column("ttft_target_s", sa.Float(), nullable=True))
        batch.add_column(sa.Column("tpot_target_s", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tenants") as batch:
        batch.drop_column("tpot_target_s")
        batch.drop_column("ttft_target_s")
