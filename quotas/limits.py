"""What is limited: a tenant's (or an API key's) limits, and one request's demand.

These are plain frozen values. How they are counted lives in ``lua/`` (GCRA, leases,
budgets); where they are stored lives in ``keys.py`` and ``store.py``.

``None`` means unlimited, as in the tenancy ``Quota`` row these mirror.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

# Largest per-minute rate the Lua arithmetic keeps exact: (60e6 µs × limit) must stay below
# 2**53, the integer range of Lua's doubles.
MAX_RATE = 100_000_000

_RESERVED = frozenset("{},= *?[]\\")  # hash-tag braces, codec separators, SCAN glob


def check_name(kind: str, value: str) -> str:
    """Refuse names that would break key hash tags or the hash encoding."""
    if not value or _RESERVED & set(value):
        raise ValueError(f"{kind} {value!r} must be non-empty and free of {{ }} , = * ? [ ] \\ and spaces")
    return value


def _nonneg(name: str, value: int | None, upper: int | None = None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative int or None, got {value!r}")
    if upper is not None and value > upper:
        raise ValueError(f"{name} must be at most {upper}, got {value}")


@dataclass(frozen=True)
class QuotaLimits:
    """Limits of one tenant, or of one API key of a tenant (both apply; the stricter wins).

    Rates are per minute with a burst equal to the per-minute limit (see ``lua/gcra.lua``).
    ``tier_shares`` maps a tier to a fraction in (0, 1]: requests of that tier are also
    counted in the tier's own sub-bucket whose requests/min, tokens/min and concurrency are
    ``max(1, floor(limit × share))``, so e.g. ``{"batch": 0.5}`` lets batch traffic use at most
    half of the tenant's rates while still drawing from the tenant's whole bucket. Budgets and
    ``max_tokens_per_request`` are not scaled by shares.
    """

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None  # prompt + completion tokens
    max_concurrency: int | None = None  # in-flight requests (leases)
    daily_token_budget: int | None = None  # tokens per UTC calendar day
    monthly_token_budget: int | None = None  # tokens per UTC calendar month
    max_tokens_per_request: int | None = None  # cap on a request's max_tokens (completion)
    allowed_tiers: frozenset[str] | None = None  # None: every tier
    tier_shares: Mapping[str, float] = field(default_factory=dict)

    @property
    def has_budget(self) -> bool:
        return self.daily_token_budget is not None or self.monthly_token_budget is not None

    def __post_init__(self) -> None:
        _nonneg("requests_per_minute", self.requests_per_minute, MAX_RATE)
        _nonneg("tokens_per_minute", self.tokens_per_minute, MAX_RATE)
        for name in (
            "max_concurrency",
            "daily_token_budget",
            "monthly_token_budget",
            "max_tokens_per_request",
        ):
            _nonneg(name, getattr(self, name))
        if self.allowed_tiers is not None:
            tiers = frozenset(check_name("tier", t) for t in self.allowed_tiers)
            object.__setattr__(self, "allowed_tiers", tiers)
        shares = dict(self.tier_shares or {})
        for tier, share in shares.items():
            check_name("tier", tier)
            if not 0.0 < float(share) <= 1.0:
                raise ValueError(f"tier share of {tier!r} must be in (0, 1], got {share!r}")
        # Sorted so that equal limits compare and hash equal; __hash__ below covers the dict.
        object.__setattr__(self, "tier_shares", dict(sorted((t, float(s)) for t, s in shares.items())))

    def __hash__(self) -> int:
        return hash(
            (
                self.requests_per_minute,
                self.tokens_per_minute,
                self.max_concurrency,
                self.daily_token_budget,
                self.monthly_token_budget,
                self.max_tokens_per_request,
                self.allowed_tiers,
                tuple(self.tier_shares.items()),
            )
        )

    @classmethod
    def from_row(cls, row: object) -> QuotaLimits:
        """Build from any object (or mapping) with the tenancy ``Quota`` row's column names."""
        get = row.get if isinstance(row, Mapping) else (lambda n, d=None: getattr(row, n, d))
        tiers: Iterable[str] | None = get("allowed_tiers", None)
        return cls(
            requests_per_minute=get("requests_per_minute", None),
            tokens_per_minute=get("tokens_per_minute", None),
            max_concurrency=get("max_concurrency", None),
            daily_token_budget=get("daily_token_budget", None),
            monthly_token_budget=get("monthly_token_budget", None),
            max_tokens_per_request=get("max_tokens_per_request", None),
            allowed_tiers=frozenset(tiers) if tiers is not None else None,
            tier_shares=get("tier_shares", None) or {},
        )


@dataclass(frozen=True)
class Demand:
    """What one request asks for: who, in which tier, and how many tokens at most.

    Admission reserves ``prompt_tokens + max_tokens`` against tokens/min and the budgets;
    settlement later corrects the charge to the real count.
    """

    tenant: str
    prompt_tokens: int
    max_tokens: int  # the request's completion cap
    key: str | None = None  # API key id; its own limits apply too when set
    tier: str = "default"

    def __post_init__(self) -> None:
        check_name("tenant", self.tenant)
        check_name("tier", self.tier)
        if self.key is not None:
            check_name("key", self.key)
        _nonneg("prompt_tokens", self.prompt_tokens)
        _nonneg("max_tokens", self.max_tokens)

    @property
    def tokens(self) -> int:
        """Tokens reserved at admission: prompt plus the completion cap."""
        return self.prompt_tokens + self.max_tokens


@dataclass(frozen=True)
class Enqueue:
    """A stream entry that an admission adds (XADD) if, and only if, it admits the demand.

    The request is then charged and queued in the same atomic call, one round trip, and never
    queued without being charged. The stream must be on the quota Redis; on Redis Cluster it
    would also have to carry the tenant's hash tag (one slot with the quota keys).
    ``settlement``: the entry also carries what settling the reservation takes (the field
    ``settle``, quotas/settlement.py), so that whoever ends the request can settle it.
    """

    stream: str
    fields: Mapping[str, str | bytes]
    settlement: bool = False


@dataclass(frozen=True)
class BudgetUse:
    """A scope's tokens charged in the UTC day and month of ``at`` (Unix seconds), as the database
    counts them (its usage records): what a Redis that lost its counters is seeded with."""

    at: float
    day_tokens: int
    month_tokens: int


def budget_periods(at: float) -> tuple[int, int]:
    """The ids the budgets' periods have in Redis (lua/periods.lua) at ``at`` (Unix seconds): days
    since 1970-01-01 and year x 12 + month - 1, both of the UTC calendar."""
    moment = datetime.fromtimestamp(at, UTC)
    return int(at // 86400), moment.year * 12 + moment.month - 1
