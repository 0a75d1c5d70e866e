"""Admin API schemas for quotas: QuotaSet (write), QuotaPublic (read), QuotaUsagePublic (live usage)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from gateway.api.schemas.admin import DB_BIGINT_MAX, DB_INT_MAX, UtcDatetime
from quotas import Usage
from quotas.limits import MAX_RATE

_LIMIT = "None (or absent): unlimited."


class QuotaSet(BaseModel):
    """The whole quota of a tenant or of one API key; a field left out becomes unlimited."""

    model_config = ConfigDict(extra="forbid")

    requests_per_minute: int | None = Field(
        None, strict=True, ge=0, le=MAX_RATE, description=f"Requests/min. {_LIMIT}"
    )
    tokens_per_minute: int | None = Field(
        None,
        strict=True,
        ge=0,
        le=MAX_RATE,
        description=f"Prompt + max_tokens per minute (corrected to use at the end). {_LIMIT}",
    )
    max_concurrency: int | None = Field(
        None, strict=True, ge=0, le=DB_INT_MAX, description=f"Requests in flight. {_LIMIT}"
    )
    daily_token_budget: int | None = Field(
        None, strict=True, ge=0, le=DB_BIGINT_MAX, description=f"Tokens per UTC day. {_LIMIT}"
    )
    monthly_token_budget: int | None = Field(
        None, strict=True, ge=0, le=DB_BIGINT_MAX, description=f"Tokens per UTC month. {_LIMIT}"
    )
    max_tokens_per_request: int | None = Field(
        None, strict=True, ge=0, le=DB_INT_MAX, description=f"Cap on a request's max_tokens. {_LIMIT}"
    )
    allowed_tiers: list[str] | None = Field(
        None, description="Service tiers this scope may use. None: every tier."
    )
    tier_shares: dict[str, float] | None = Field(
        None, description='Fraction in (0, 1] of the rates a tier may use, e.g. {"batch": 0.5}.'
    )


class QuotaPublic(QuotaSet):
    """A stored quota; ``configured`` is False (and every limit None) when the scope has no row."""

    model_config = ConfigDict(from_attributes=True, extra="ignore")

    tenant_id: int
    key_id: int | None = None
    configured: bool = True
    updated_at: UtcDatetime | None = None


class RatePublic(BaseModel):
    limit: int = Field(description="Per minute.")
    remaining: int = Field(description="Units that would be admitted now.")
    reset_after_s: float = Field(description="Seconds until the bucket is full again.")


class BudgetPublic(BaseModel):
    used: int = Field(description="Tokens charged in this period, open reservations included.")
    remaining: int | None = Field(description="None: no budget.")
    reset_after_s: float = Field(description="Seconds until the period (UTC) ends.")


class QuotaUsagePublic(BaseModel):
    """Live counters of a tenant or key, read from the quota Redis (what the next request meets)."""

    tenant_id: int
    key_id: int | None = None
    configured: bool = Field(description="Limits are loaded in Redis (else the next request loads them).")
    requests: RatePublic | None = Field(description="None: not limited.")
    tokens: RatePublic | None = Field(description="None: not limited.")
    in_flight: int
    max_concurrency: int | None
    daily: BudgetPublic
    monthly: BudgetPublic

    @classmethod
    def from_usage(cls, usage: Usage, *, tenant_id: int, key_id: int | None) -> QuotaUsagePublic:
        def rate(info):
            return (
                None
                if info is None
                else RatePublic(limit=info.limit, remaining=info.remaining, reset_after_s=info.reset_after)
            )

        return cls(
            tenant_id=tenant_id,
            key_id=key_id,
            configured=usage.configured,
            requests=rate(usage.requests),
            tokens=rate(usage.tokens),
            in_flight=usage.in_flight,
            max_concurrency=usage.max_concurrency,
            daily=BudgetPublic(
                used=usage.daily_used, remaining=usage.daily_remaining, reset_after_s=usage.daily_reset_after
            ),
            monthly=BudgetPublic(
                used=usage.monthly_used,
                remaining=usage.monthly_remaining,
                reset_after_s=usage.monthly_reset_after,
            ),
        )
