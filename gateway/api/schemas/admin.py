"""Admin API schemas: one family per entity (Create / Update / Public)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import Path, Query
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from tenancy.tenants import MAX_WEIGHT, MIN_WEIGHT  # fair-share weights: a 10^4 spread, no underflow

DB_INT_MAX = 2**31 - 1  # INTEGER columns (ids, most quota limits): a larger value is a 422, never an overflow
DB_BIGINT_MAX = 2**63 - 1  # BIGINT columns (token budgets)
DB_ID_MAX = DB_INT_MAX
DbId = Annotated[int, Path(ge=1, le=DB_ID_MAX, description="A database id.")]
# A list's page: at most ``limit`` rows (all without it), those after the id ``after``, by id.
PageLimit = Annotated[int | None, Query(ge=1, le=1000, description="At most this many (default: all).")]
PageAfter = Annotated[
    int | None, Query(ge=0, le=DB_ID_MAX, description="Only those with a greater id (a page's last id).")
]


def fetch_limit(limit: int | None) -> int | None:
    """How many rows to read for a page of ``limit``: one more, which tells whether more follow."""
    return None if limit is None else limit + 1


def page_of(rows: list, limit: int | None) -> tuple[list, bool]:
    """The page of rows read with ``fetch_limit(limit)``, and whether a later page holds more."""
    page = rows[:limit]
    return page, len(rows) > len(page)


def _aware(value: datetime | None) -> datetime | None:
    """Stored times are UTC; SQLite gives them back naive."""
    return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value


UtcDatetime = Annotated[datetime, AfterValidator(_aware)]  # ISO-8601 with its timezone, always
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TenantCreate(_Strict):
    name: str = Field(pattern=NAME_PATTERN, description="Unique tenant name.")
    weight: float = Field(
        1.0,
        ge=MIN_WEIGHT,
        le=MAX_WEIGHT,
        strict=True,  # true is not 1.0
        allow_inf_nan=False,
        description="Share of the engine under contention (fair share).",
    )
    default_tier: str = Field("standard", description="Lane used when a request names no service_tier.")
    allowed_tiers: list[str] = Field(default_factory=lambda: ["standard", "batch"], min_length=1)
    ttft_target_s: float | None = Field(
        None,
        gt=0,
        strict=True,
        allow_inf_nan=False,
        description="Time-to-first-token target (s) of this "
        "tenant's requests, over its tier's; null: the tier's.",
    )
    tpot_target_s: float | None = Field(
        None,
        gt=0,
        strict=True,
        allow_inf_nan=False,
        description="Time-per-output-token target (s), over its tier's; null: the tier's.",
    )


class TenantUpdate(_Strict):
    name: str | None = Field(None, pattern=NAME_PATTERN)
    weight: float | None = Field(None, ge=MIN_WEIGHT, le=MAX_WEIGHT, strict=True, allow_inf_nan=False)
    default_tier: str | None = None
    allowed_tiers: list[str] | None = Field(None, min_length=1)
    status: str | None = Field(None, pattern="^(active|disabled)$")
    ttft_target_s: float | None = Field(
        None, gt=0, strict=True, allow_inf_nan=False, description="null clears it (the tier's applies)."
    )
    tpot_target_s: float | None = Field(
        None, gt=0, strict=True, allow_inf_nan=False, description="null clears it (the tier's applies)."
    )


class TenantPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    weight: float
    default_tier: str
    allowed_tiers: list[str]
    status: str
    ttft_target_s: float | None = None
    tpot_target_s: float | None = None
    created_at: UtcDatetime


class TenantsPublic(BaseModel):
    data: list[TenantPublic]
    count: int  # of this page
    has_more: bool = False  # a later page holds more: ask again with ``after`` the last id here


class ApiKeyCreate(_Strict):
    name: str = Field("", max_length=128)
    scopes: list[str] = Field(default_factory=lambda: ["inference"])


class ApiKeyPublic(BaseModel):
    """A key as it can be shown any time: the prefix, never the secret."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    tenant_id: int
    prefix: str
    name: str
    scopes: list[str]
    created_at: UtcDatetime
    last_used_at: UtcDatetime | None
    revoked_at: UtcDatetime | None


class ApiKeyCreated(ApiKeyPublic):
    """Returned once, at creation: ``key`` is the full secret and is not stored anywhere."""

    key: str


class ApiKeysPublic(BaseModel):
    data: list[ApiKeyPublic]
    count: int  # of this page
    has_more: bool = False  # a later page holds more: ask again with ``after`` the last id here


class UsageTotalsPublic(BaseModel):
    requests: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class UsagePublic(BaseModel):
    tenant_id: int
    since: UtcDatetime
    until: UtcDatetime
    totals: UsageTotalsPublic
    by_model: dict[str, UsageTotalsPublic]
    by_tier: dict[str, UsageTotalsPublic]


ADAPTER_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"  # no ':' (the model name's separator)


class AdapterPublic(BaseModel):
    """A stored LoRA adapter; ``sha256`` is the digest of its files (the folder in the adapter store)."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    tenant_id: int
    rank: int
    alpha: float
    target_modules: list[str]
    size_bytes: int
    sha256: str
    created_at: UtcDatetime


class AdaptersPublic(BaseModel):
    data: list[AdapterPublic]
    count: int  # of this page
    has_more: bool = False  # a later page holds more: ask again with ``after`` the last id here
