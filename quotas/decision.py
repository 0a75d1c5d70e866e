"""Results of the quota library: an admission ``Decision``, its ``Reservation``, ``Usage``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

# The limit that refused a request; also the ``code`` a gateway may put in its error body.
LimitName = Literal[
    "requests_per_minute",
    "tokens_per_minute",
    "concurrency",
    "daily_budget",
    "monthly_budget",
    "max_tokens",
    "tier",
]
Scope = Literal["tenant", "key"]
SettleOutcome = Literal["settled", "unknown", "not_charged", "unavailable"]


@dataclass(frozen=True)
class RateInfo:
    """One rate limit as OpenAI's headers show it: the strictest bucket that applies."""

    limit: int  # per minute (tier-scaled for a tier sub-bucket)
    remaining: int  # units that would be admitted now
    reset_after: float  # seconds until the bucket is full again


@dataclass(frozen=True)
class Reservation:
    """What an admission charged; hand it to ``Limiter.settle`` or ``Limiter.refund`` once.

    ``lease_id`` is the concurrency lease held until settlement (or ``lease_ttl``).
    ``charged`` is False when a fail-open limiter admitted without Redis: settling is a no-op.
    """

    id: str
    tenant: str
    key: str | None
    tier: str
    reserved_tokens: int  # prompt_tokens + max_tokens
    lease_id: str
    charged: bool = True


@dataclass(frozen=True)
class Decision:
    """The answer to one admission.

    ``allowed``: admit the request. Otherwise ``limit`` names the limit that refused (of
    several, the one that frees up last), ``scope`` says whose limit it was, and
    ``retry_after`` is the wait in seconds, or None when waiting cannot help (the request
    asks more than the limit allows at all: tier, max_tokens, or tokens above a whole limit).
    ``requests``/``tokens`` feed the ``x-ratelimit-*`` headers (None: not limited).
    ``enforced`` is False when Redis was down and the limiter fails open.
    ``entry_id`` is the id of the stream entry the admission added (``admit(enqueue=...)``),
    None when it added none (refused, or admitted unchecked while Redis is down).
    """

    allowed: bool
    limit: LimitName | None = None
    scope: Scope | None = None
    retry_after: float | None = None  # seconds
    reservation: Reservation | None = None
    requests: RateInfo | None = None
    tokens: RateInfo | None = None
    enforced: bool = True
    entry_id: str | None = None

    @property
    def retryable(self) -> bool:
        """True when the same request may be admitted later (a 429 with retry-after)."""
        return not self.allowed and self.retry_after is not None

    @property
    def message(self) -> str:
        """A refusal in words, for the error body's ``message`` ('' when allowed)."""
        if self.allowed:
            return ""
        what = _WORDS.get(self.limit or "", self.limit or "quota")
        whose = "API key" if self.scope == "key" else "organization"
        if self.retry_after is None:
            return f"Request refused by the {whose}'s {what}: it can never be admitted as sent."
        if self.limit in _PERIODS:  # hours away: a duration, not 6.82e+04s
            return (
                f"The {whose}'s {what} is spent for this request; it renews at the end of the UTC "
                f"{_PERIODS[self.limit]}, in {format_duration(self.retry_after)}."
            )
        return f"Rate limit reached for the {whose}'s {what}. Please try again in {self.retry_after:.3g}s."


_PERIODS = {"daily_budget": "day", "monthly_budget": "month"}
_WORDS = {
    "requests_per_minute": "requests per minute",
    "tokens_per_minute": "tokens per minute (prompt + max_tokens)",
    "concurrency": "concurrent requests",
    "daily_budget": "daily token budget",
    "monthly_budget": "monthly token budget",
    "max_tokens": "max_tokens per request",
    "tier": "allowed service tiers",
}


@dataclass(frozen=True)
class Usage:
    """A scope's current usage, for the admin API (``QuotaStore.usage``)."""

    tenant: str
    key: str | None
    configured: bool  # limits are stored in Redis for this scope
    requests: RateInfo | None  # None: not limited
    tokens: RateInfo | None
    in_flight: int  # unexpired concurrency leases
    max_concurrency: int | None
    daily_used: int  # tokens charged today (UTC), reservations included
    daily_remaining: int | None  # None: no daily budget
    daily_reset_after: float  # seconds until the UTC day ends
    monthly_used: int
    monthly_remaining: int | None
    monthly_reset_after: float


def format_duration(seconds: float) -> str:
    """A duration as OpenAI (Go's ``time.Duration``) writes it: 20ms, 1s, 1.5s, 6m0s, 1h2m3s.

    Rounded up to whole milliseconds: a reset is never announced earlier than it happens.
    """
    ms = max(0, math.ceil(round(seconds * 1000, 6)))  # round() drops float noise first
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs = f"{rest // 1000}.{rest % 1000:03d}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{hours}h{minutes}m{secs}"
    if minutes:
        return f"{minutes}m{secs}"
    return secs
