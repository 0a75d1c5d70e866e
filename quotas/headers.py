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

from .decision import Decision, RateInfo, format_duration

WINDOW_S = 60.0  # the rate window (gcra.lua's WINDOW)


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
