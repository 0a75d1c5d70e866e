"""Quotas on Redis: rate limits (GCRA), concurrency leases, token budgets, reservations.

Kept apart as in the ``limits`` library: *what* is limited (``limits.py``), *how* it is
counted (``lua/*.lua``, one atomic script per admission and per settlement) and *where* it
is stored (``keys.py``, ``store.py``). ``Limiter`` is the one entry point the gateway calls::

    limiter = Limiter(connect(url), loader=load_limits_from_db)
    decision = await limiter.admit(Demand(tenant, prompt_tokens, max_tokens, key=key, tier=tier))
    headers = rate_limit_headers(decision)          # on every response
    ...                                             # run the request if decision.allowed
    await limiter.settle(decision.reservation, used_tokens)   # or limiter.refund(...)

Rate algorithm: GCRA (the Generic Cell Rate Algorithm), chosen over a token bucket because
its whole state is one timestamp per bucket (the theoretical arrival time), updated with a
compare and one write; no refill bookkeeping, no drift between refill and use. It is exact
for any cost (tokens) and any limit, refunds are just moving the timestamp back, and its
retry-after and reset fall out of the same arithmetic. Burst = the per-minute limit: an idle
tenant may spend a whole minute's allowance at once, then one unit per 60 s / limit.
"""

from .client import connect
from .decision import Decision, LimitName, RateInfo, Reservation, SettleOutcome, Usage, format_duration
from .errors import QuotaBackendUnavailable, QuotaError, QuotaNotConfigured
from .headers import rate_limit_headers, refunded, retry_headers
from .keys import KeySpace
from .limiter import BudgetLoader, Limiter, Loader
from .limits import BudgetUse, Demand, Enqueue, QuotaLimits
from .store import QuotaStore

__all__ = [
    "BudgetLoader",
    "BudgetUse",
    "Decision",
    "Demand",
    "Enqueue",
    "KeySpace",
    "LimitName",
    "Limiter",
    "Loader",
    "QuotaBackendUnavailable",
    "QuotaError",
    "QuotaLimits",
    "QuotaNotConfigured",
    "QuotaStore",
    "RateInfo",
    "Reservation",
    "SettleOutcome",
    "Usage",
    "connect",
    "format_duration",
    "rate_limit_headers",
    "refunded",
    "retry_headers",
]
