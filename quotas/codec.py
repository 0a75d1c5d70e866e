"""Encoding between Python values and what the Lua scripts read and reply, in one place."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .decision import Decision, RateInfo, Reservation, Usage
from .limits import Demand, QuotaLimits

US = 1_000_000  # µs per second: the scripts' time unit

# QuotaLimits field → limits hash field (as admit.lua reads it).
_INT_FIELDS = {
    "requests_per_minute": "rpm",
    "tokens_per_minute": "tpm",
    "max_concurrency": "conc",
    "daily_token_budget": "day",
    "monthly_token_budget": "month",
    "max_tokens_per_request": "maxtok",
}


def encode_limits(limits: QuotaLimits) -> dict[str, str]:
    """The limits hash. ``v`` marks the hash as present; an absent field is unlimited.

    Tiers are stored as ``,a,b,`` (so the Lua tests ``,tier,``), shares as ``a=0.5,b=0.25``.
    """
    fields = {"v": "1"}
    for attr, name in _INT_FIELDS.items():
        value = getattr(limits, attr)
        if value is not None:
            fields[name] = str(value)
    if limits.allowed_tiers is not None:
        fields["tiers"] = "," + "".join(f"{t}," for t in sorted(limits.allowed_tiers))
    if limits.tier_shares:
        fields["shares"] = ",".join(f"{t}={s!r}" for t, s in limits.tier_shares.items())
    return fields


def decode_limits(fields: Mapping[bytes | str, bytes | str]) -> QuotaLimits | None:
    """The inverse of ``encode_limits``; None for a missing hash."""
    f = {as_text(k): as_text(v) for k, v in fields.items()}
    if "v" not in f:
        return None
    kwargs: dict = {attr: int(f[name]) for attr, name in _INT_FIELDS.items() if name in f}
    if "tiers" in f:
        kwargs["allowed_tiers"] = frozenset(t for t in f["tiers"].split(",") if t)
    if "shares" in f:
        pairs = (p.split("=") for p in f["shares"].split(",") if p)
        kwargs["tier_shares"] = {t: float(s) for t, s in pairs}
    return QuotaLimits(**kwargs)


def now_arg(now: float | None) -> str:
    """The scripts' ARGV[1]: an injected time in µs, or '' for Redis TIME."""
    return "" if now is None else str(round(now * US))


def as_text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _rate(limit: int, remaining: int, reset_us: bytes | int) -> RateInfo | None:
    if int(limit) < 0:
        return None
    return RateInfo(limit=int(limit), remaining=int(remaining), reset_after=int(reset_us) / US)


def missing_scope(reply: Sequence) -> str | None:
    """``"tenant"`` or ``"key"`` when admit.lua found no limits for that scope, else None."""
    return as_text(reply[2]) if int(reply[0]) == -1 else None


def decode_admit(reply: Sequence, demand: Demand, reservation_id: str) -> Decision:
    """A Decision from admit.lua's reply (status 1 or 0; -1 is handled by the limiter).

    An admission that queued a stream entry replies its id as an 11th element.
    """
    status, limit, scope, retry_us = int(reply[0]), as_text(reply[1]), as_text(reply[2]), int(reply[3])
    requests, tokens = _rate(*reply[4:7]), _rate(*reply[7:10])
    if status == 1:
        reservation = Reservation(
            id=reservation_id,
            tenant=demand.tenant,
            key=demand.key,
            tier=demand.tier,
            reserved_tokens=demand.tokens,
            lease_id=reservation_id,
        )
        entry_id = as_text(reply[10]) if len(reply) > 10 and reply[10] else None
        return Decision(True, reservation=reservation, requests=requests, tokens=tokens, entry_id=entry_id)
    return Decision(
        False,
        limit=limit,  # type: ignore[arg-type]  # one of LimitName: admit.lua's own vocabulary
        scope=scope,  # type: ignore[arg-type]
        retry_after=None if retry_us < 0 else retry_us / US,
        requests=requests,
        tokens=tokens,
    )


def decode_usage(reply: Sequence, tenant: str, key: str | None, limits: QuotaLimits | None) -> Usage:
    """Usage from usage.lua's reply and the scope's limits."""
    day_used, month_used = int(reply[8]), int(reply[9])
    now_us = int(reply[12])
    day_budget = limits.daily_token_budget if limits else None
    month_budget = limits.monthly_token_budget if limits else None
    return Usage(
        tenant=tenant,
        key=key,
        configured=bool(int(reply[0])),
        requests=_rate(*reply[1:4]),
        tokens=_rate(*reply[4:7]),
        in_flight=int(reply[7]),
        max_concurrency=limits.max_concurrency if limits else None,
        daily_used=day_used,
        daily_remaining=None if day_budget is None else max(0, day_budget - day_used),
        daily_reset_after=(int(reply[10]) - now_us) / US,
        monthly_used=month_used,
        monthly_remaining=None if month_budget is None else max(0, month_budget - month_used),
        monthly_reset_after=(int(reply[11]) - now_us) / US,
    )
