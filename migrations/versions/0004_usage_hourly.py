"""usage_hourly: per tenant, key and UTC hour roll-ups of the usage records (the console's charts)

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-25 16:00:00

The table is filled from the existing usage records, so charts cover the history from the start.
Key ids are 0 where a record has none (a primary key column cannot be NULL); -1 marks a tenant's
total over all its keys in that hour, -2 its total over a UTC day, stored at the day's first hour
(tenancy/usage_rollup.py).
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

COUNTERS = ("requests", "prompt_tokens", "completion_tokens", "errors", "slo_refusals", "rate_limited")
BACKFILL = """
INSERT INTO usage_hourly (hour, tenant_id, key_id, requests, prompt_tokens, completion_tokens,
                          errors, slo_refusals, rate_limited)
SELECT {hour} AS h, tenant_id, COALESCE(key_id, 0) AS k, COUNT(*), SUM(prompt_tokens),
       SUM(completion_tokens), SUM(CASE WHEN status = 'error' THEN 1 ELSE 0 END),
       SUM(CASE WHEN status = 'slo_unattainable' THEN 1 ELSE 0 END), 0
FROM usage_records GROUP BY h, tenant_id, k
"""
TENANT_TOTALS = """
INSERT INTO usage_hourly (hour, tenant_id, key_id, requests, prompt_tokens, completion_tokens,
                          errors, slo_refusals, rate_limited)
SELECT hour, tenant_id, -1, SUM(requests), SUM(prompt_tokens), SUM(completion_tokens), SUM(errors),
       SUM(slo_refusals), SUM(rate_limited)
FROM usage_hourly GROUP BY hour, tenant_id
"""
DAY_TOTALS = """
INSERT INTO usage_hourly (hour, tenant_id, key_id, requests, prompt_tokens, completion_tokens,
                          errors, slo_refusals, rate_limited)
SELECT {day} AS d, tenant_id, -2, SUM(requests), SUM(prompt_tokens), SUM(completion_tokens),
       SUM(errors), SUM(slo_refusals), SUM(rate_limited)
FROM usage_hourly WHERE key_id = -1 GROUP BY d, tenant_id
"""


def upgrade() -> None:
    op.create_table(
        "usage_hourly",
        sa.Column("tenant_id", sa.Integer(), nullable=False),
        sa.Column("key_id", sa.Integer(), nullable=False),
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("completion_tokens", sa.BigInteger(), nullable=False),
        sa.Column("errors", sa.Integer(), nullable=False),
        sa.Column("slo_refusals", sa.Integer(), nullable=False),
        sa.Column("rate_limited", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_usage_hourly_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("tenant_id", "key_id", "hour", name=op.f("pk_usage_hourly")),
    )
    op.create_index(
        "ix_usage_hourly_key_id_hour",
        "usage_hourly",
        ["key_id", "hour"],
        unique=False,
        postgresql_include=["tenant_id", *COUNTERS],
    )
    if op.get_bind().dialect.name == "postgresql":
        hour = "date_trunc('hour', created_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'"
        day = "date_trunc('day', hour AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'"
    else:  # SQLite stores 'YYYY-MM-DD HH:MM:SS.ffffff' (UTC)
        hour = "strftime('%Y-%m-%d %H:00:00.000000', created_at)"
        day = "strftime('%Y-%m-%d 00:00:00.000000', hour)"
    op.execute(BACKFILL.format(hour=hour))
    op.execute(TENANT_TOTALS)
    op.execute(DAY_TOTALS.format(day=day))


def downgrade() -> None:
    op.drop_index("ix_usage_hourly_key_id_hour", table_name="usage_hourly")
    op.drop_table("usage_hourly")
