"""OpenAI's rate-limit headers from a ``Decision``.

OpenAI sends, on every response::

    x-ratelimit-limit-requests      x-ratelimit-limit-tokens        (per minute)
    x-ratelimit-remaining-requests  x-ratelimit-remaining-tokens
    x-ratelimit-reset-requests      x-ratelimit-reset-tokens        ("1s", "6m0s", "20ms")

and ``retry-after`` (whole seconds) with ``retry-after-ms`` on a 429. The official client
honours ``retry-after-ms`` first, then ``retry-after``; both are rounded up so that a retry
never comes before the window has room.
"""

from __future__ import annotations

import math
from dataclasses import replace

from .decision import Decision, RateInfo

WINDOW_S = 60.0  # the rate window (gcra.lua's WINDOW)


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


def _family(name: str, info: RateInfo | None) -> dict[str, str]:
    if info is None:
        return {}
    return {
        f"x-ratelimit-limit-{name}": str(info.limit),
        f"x-ratelimit-remaining-{name}": str(info.remaining),
        f"x-ratelimit-reset-{name}": format_duration(info.reset_after),
    }


def retry_headers(retry_after: float) -> dict[str, str]:
    """``retry-after`` (integer seconds, rounded up, at least 1) and ``retry-after-ms``."""
    ms = max(1, math.ceil(round(retry_after * 1000, 6)))
    return {"retry-after": str(max(1, math.ceil(ms / 1000))), "retry-after-ms": str(ms)}


def refunded(decision: Decision, tokens: int) -> Decision:
    """An admitted decision's rates once its reservation is refunded: one request and ``tokens``
    back in each bucket (settle.lua moves each TAT back by as much; exact while nothing else was
    charged meanwhile), so that an error answered after the refund shows them as they are."""
    return replace(decision, requests=_back(decision.requests, 1), tokens=_back(decision.tokens, tokens))


def _back(info: RateInfo | None, units: int) -> RateInfo | None:
    if info is None or info.limit <= 0:
        return info
    reset = max(0.0, info.reset_after - units * WINDOW_S / info.limit)
    return RateInfo(info.limit, min(info.limit, info.remaining + units), reset)


def rate_limit_headers(decision: Decision) -> dict[str, str]:
    """Every header for a response to this decision (rates that are not limited are omitted).

    ``retry-after``/``retry-after-ms`` are present only on a retryable refusal.
    """
    headers = _family("requests", decision.requests) | _family("tokens", decision.tokens)
    if decision.retryable:
        assert decision.retry_after is not None
        headers |= retry_headers(decision.retry_after)
    return headers
