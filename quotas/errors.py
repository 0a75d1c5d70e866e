"""Errors a caller of the quota library can meet; each maps to one HTTP status."""

from __future__ import annotations


class QuotaError(Exception):
    """Base of the quota library's errors."""


class QuotaBackendUnavailable(QuotaError):
    """Redis could not be reached and the limiter fails closed.

    The gateway answers 503 with ``Retry-After: ceil(retry_after)`` and this message.
    """

    def __init__(self, retry_after: float, cause: BaseException | None = None) -> None:
        self.retry_after = retry_after  # seconds
        reason = f": {type(cause).__name__}: {cause}" if cause is not None else ""
        super().__init__(
            f"quota service unavailable, request not admitted; retry after {retry_after:g} s{reason}"
        )


class QuotaNotConfigured(QuotaError):
    """No limits are stored in Redis for a tenant (or key) and no loader was given.

    A deployment error: the gateway answers 503. Give ``Limiter`` a loader, or write limits
    with ``QuotaStore.put`` (``QuotaLimits()`` means unlimited).
    """

    def __init__(self, tenant: str, key: str | None = None) -> None:
        self.tenant, self.key = tenant, key
        who = f"tenant {tenant!r}" + (f" key {key!r}" if key is not None else "")
        super().__init__(f"no quota limits stored for {who}")
