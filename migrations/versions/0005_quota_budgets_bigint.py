"""quotas: daily and monthly token budgets as 64-bit integers

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-27 00:30:00

A month of a large tenant's tokens passes 2^31; PostgreSQL's INTEGER refused such a budget. The
other limits (rates, concurrency, a request's max_tokens) stay 32-bit: the admin API bounds them.
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

BUDGETS = ("daily_token_budget", "monthly_token_budget")


def upgrade() -> None:
    with op.batch_alter_table("quotas") as batch:
        for name in BUDGETS:
            batch.alter_column(
                name, existing_type=sa.Integer(), type_=sa.BigInteger(), existing_nullable=True
            )


def downgrade() -> None:
    with op.batch_alter_table("quotas") as batch:
        for name in BUDGETS:
            batch.alter_column(
                name, existing_type=sa.BigInteger(), type_=sa.Integer(), existing_nullable=True
            )
