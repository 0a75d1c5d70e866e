"""SQLAlchemy 2 models: tenants, API keys, adapters, quota rows and usage records.

Every table hangs off a tenant. Limits that are NULL mean "unlimited"; the quotas package reads
the Quota rows, the gateway writes UsageRecord rows once per finished request.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

# Stable constraint names so migrations can drop what they created on every backend.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

TENANT_ACTIVE = "active"
TENANT_DISABLED = "disabled"


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: DateTime(timezone=True), dict[str, Any]: JSON, list[str]: JSON}


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    weight: Mapped[float] = mapped_column(Float, default=1.0)
    default_tier: Mapped[str] = mapped_column(String(32), default="standard")
    allowed_tiers: Mapped[list[str]] = mapped_column(JSON, default=lambda: ["standard", "batch"])
    status: Mapped[str] = mapped_column(String(16), default=TENANT_ACTIVE)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # Latency targets (seconds) of this tenant's requests, over its tier's; NULL: the tier's.
    ttft_target_s: Mapped[float | None] = mapped_column(Float, default=None)
    tpot_target_s: Mapped[float | None] = mapped_column(Float, default=None)

    api_keys: Mapped[list[ApiKey]] = relationship(back_populates="tenant", cascade="all, delete-orphan")

    @property
    def active(self) -> bool:
        return self.status == TENANT_ACTIVE


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    # prefix: public part of the key ("fl-" + 8 chars), for lookup and display.
    prefix: Mapped[str] = mapped_column(String(16), unique=True)
    # secret_hash: sha256 hex of the whole key; the key itself is never stored.
    secret_hash: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(128), default="")
    scopes: Mapped[list[str]] = mapped_column(JSON, default=lambda: ["inference"])
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(default=None)
    revoked_at: Mapped[datetime | None] = mapped_column(default=None)

    tenant: Mapped[Tenant] = relationship(back_populates="api_keys")

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None


class Adapter(Base):
    """A tenant's PEFT LoRA adapter. Its files live in the adapter store (gateway/adapters), in the
    folder named by ``sha256``, the digest of their content: rows with the same files share it."""

    __tablename__ = "adapters"
    __table_args__ = (UniqueConstraint("tenant_id", "name", name="uq_adapters_tenant_id_name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(128))
    sha256: Mapped[str] = mapped_column(String(64), index=True)
    rank: Mapped[int] = mapped_column(Integer)
    alpha: Mapped[float] = mapped_column(Float)
    target_modules: Mapped[list[str]] = mapped_column(JSON)
    size_bytes: Mapped[int] = mapped_column(BigInteger)  # both files
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Quota(Base):
    """Limits for a tenant (key_id NULL) or one of its keys; every NULL limit is unlimited."""

    __tablename__ = "quotas"
    __table_args__ = (UniqueConstraint("tenant_id", "key_id", name="uq_quotas_tenant_id_key_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    key_id: Mapped[int | None] = mapped_column(ForeignKey("api_keys.id", ondelete="CASCADE"), default=None)
    requests_per_minute: Mapped[int | None] = mapped_column(default=None)
    tokens_per_minute: Mapped[int | None] = mapped_column(default=None)
    max_concurrency: Mapped[int | None] = mapped_column(default=None)
    daily_token_budget: Mapped[int | None] = mapped_column(BigInteger, default=None)
    monthly_token_budget: Mapped[int | None] = mapped_column(BigInteger, default=None)
    max_tokens_per_request: Mapped[int | None] = mapped_column(default=None)
    allowed_tiers: Mapped[list[str] | None] = mapped_column(JSON, default=None)
    # tier_shares: fraction of the tenant's limits a tier may use, e.g. {"batch": 0.5}.
    tier_shares: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class UsageRecord(Base):
    """One finished (or failed) request; written once, keyed by the request id."""

    __tablename__ = "usage_records"
    __table_args__ = (Index("ix_usage_records_tenant_id_created_at", "tenant_id", "created_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    request_id: Mapped[str] = mapped_column(String(64), unique=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    key_id: Mapped[int | None] = mapped_column(ForeignKey("api_keys.id", ondelete="SET NULL"), default=None)
    model: Mapped[str] = mapped_column(String(256))
    tier: Mapped[str] = mapped_column(String(32))
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    ttft_ms: Mapped[float | None] = mapped_column(Float, default=None)
    latency_ms: Mapped[float | None] = mapped_column(Float, default=None)
    status: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


ROLLUP_COUNTERS = ("requests", "prompt_tokens", "completion_tokens", "errors", "slo_refusals", "rate_limited")


class UsageHourly(Base):
    """Usage of one tenant's key (key_id 0: no key) in one UTC hour: what the console's charts read.

    Kept in step with usage_records by ``record_usage`` (same transaction), so a chart never scans
    raw rows; ``rate_limited`` counts quota refusals (429s), which leave no usage record.
    """

    __tablename__ = "usage_hourly"
    # Views of every tenant read the tenants' total rows (key_id -1) of a range of hours: one index
    # range, answered from the index alone on PostgreSQL.
    __table_args__ = (
        Index(
            "ix_usage_hourly_key_id_hour",
            "key_id",
            "hour",
            postgresql_include=["tenant_id", *ROLLUP_COUNTERS],
        ),
    )

    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True)
    key_id: Mapped[int] = mapped_column(Integer, primary_key=True)  # 0: no key
    hour: Mapped[datetime] = mapped_column(primary_key=True)  # UTC, truncated to the hour
    requests: Mapped[int] = mapped_column(Integer, default=0)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    completion_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    errors: Mapped[int] = mapped_column(Integer, default=0)  # requests that ended in an error
    slo_refusals: Mapped[int] = mapped_column(Integer, default=0)  # refused for their latency target
    rate_limited: Mapped[int] = mapped_column(Integer, default=0)  # refused by a quota (429)
