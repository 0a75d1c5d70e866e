"""The quota service: the one dependency in the request path that admits and settles requests.

``admit`` runs ``quotas.Limiter.admit`` (one Lua call on Redis: RPM, TPM on prompt + max_tokens,
concurrency lease, daily/monthly token budgets, max_tokens, tier; the tenant's limits and the API
key's both apply) and maps a refusal to its HTTP error here, in one place (quotas/README.md):

| refusal | status | error code |
| --- | --- | --- |
| requests/tokens per minute, concurrency | 429 | ``rate_limit_exceeded`` (+ retry-after, retry-after-ms) |
| daily / monthly token budget | 429 | ``insufficient_quota`` (+ retry-after: the period's end) |
| tokens per minute, request above the whole limit | 429 | ``rate_limit_exceeded``, no retry-after |
| max_tokens per request | 400 | param ``max_tokens`` |
| service tier not in the quota | 403 | ``tier_not_allowed``, param ``service_tier`` |
| quota Redis unreachable (fail-closed) | 503 | ``quota_unavailable`` (+ retry-after) |

A request admitted here and then refused for its latency target (the SLO door check, or the
engine) is refunded in full like one that failed before running.

When the quota Redis is also the lanes' Redis, the admission queues the request in its lane in
the same Lua call (``quotas.Enqueue``): one round trip for both, and never queued uncharged
(not for a request the SLO door check must see first: that one is admitted, checked, then queued).

Every admitted or refused request gets OpenAI's ``x-ratelimit-*`` headers. ``settle`` runs exactly
once when the request ends: the real usage (prompt + completion tokens) for a request that ran,
a full refund for one that failed before running (enqueue failure, refused by the worker, client
gone before the first result). Open admissions renew their concurrency leases every
``lease_ttl / 3`` so that long streams keep their slot. Scopes are the database ids of the tenant
and of the key; limits come from the tenancy ``Quota`` rows, copied into Redis on first sight and
by the admin API on every change.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, TypeVar

from fastapi import Depends, Request
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from gateway.api.auth import AuthContext
from gateway.api.errors import (
    InsufficientQuota,
    InvalidRequest,
    PermissionDenied,
    RateLimited,
    quota_unavailable,
)
from gateway.api.outcome import RequestOutcome
from gateway.api.ratelimit_headers import publish
from gateway.api.refusal_tally import RefusalTally
from gateway.settings import ApiSettings
from gateway.telemetry import metrics, tracing
from quotas import (
    BudgetLoader,
    BudgetUse,
    Decision,
    Demand,
    Enqueue,
    KeySpace,
    Limiter,
    Loader,
    QuotaBackendUnavailable,
    QuotaLimits,
    QuotaNotConfigured,
    Reservation,
    SettleOutcome,
    connect,
    rate_limit_headers,
    refunded,
    retry_headers,
)
from tenancy import budget_use, get_quota

log = logging.getLogger(__name__)
T = TypeVar("T")
# A settlement Redis did not answer (an outage, or a pool without a free connection under overload)
# is tried again this often, for this long: until then the request's concurrency slot stays taken
# and its whole reservation charged, which would otherwise last until the lease expires (lease_ttl).
SETTLE_RETRY_S, SETTLE_RETRY_FOR_S = 1.0, 120.0


@dataclass
class Admission:
    """A request that was let in: what it reserved, and the headers to send back with it."""

    auth: AuthContext
    request_id: str
    tier: str
    prompt_tokens: int
    max_tokens: int
    headers: dict[str, str] = field(default_factory=dict)
    settled: bool = False
    reservation: Reservation | None = None  # None: quotas off (no limiter)
    decision: Decision | None = None  # the admission's (its rates: the headers)
    queued: bool = False  # the admission also queued the request in its lane
    # its lane entry carries its settlement: the worker settles it with its last result
    worker_settles: bool = False
    admitted_at: float = field(default_factory=time.monotonic)


def _once_per_scope(read: Callable[[str, str | None], T]) -> Callable[[str, str | None], Awaitable[T]]:
    """``read(tenant_id, key_id)`` (a database read) in the thread pool, once per scope however many
    requests find the scope missing at once (first sight, or every tenant after a Redis restart)."""
    pending: dict[tuple[str, str | None], asyncio.Future] = {}

    async def once(tenant_id: str, key_id: str | None) -> T:
        scope = (tenant_id, key_id)
        if scope not in pending:
            pending[scope] = asyncio.ensure_future(run_in_threadpool(read, tenant_id, key_id))
            pending[scope].add_done_callback(lambda _: pending.pop(scope, None))
        return await asyncio.shield(pending[scope])

    return once


def tenancy_loader(session_factory: sessionmaker[Session]) -> Loader:
    """The limiter's loader: a scope's tenancy Quota row (scopes are database ids) → QuotaLimits."""

    def load(tenant_id: str, key_id: str | None) -> QuotaLimits | None:
        with session_factory() as session:
            row = get_quota(session, tenant_id=int(tenant_id), key_id=None if key_id is None else int(key_id))
            return None if row is None else QuotaLimits.from_row(row)

    return _once_per_scope(load)


def tenancy_budget_loader(session_factory: sessionmaker[Session]) -> BudgetLoader:
    """The limiter's budget loader: a scope's tokens charged this UTC day and month, from the
    usage roll-ups (read when Redis lost the scope's counters, with its limits)."""

    def count(tenant_id: str, key_id: str | None) -> BudgetUse:
        at = time.time()
        with session_factory() as session:
            day, month = budget_use(
                session,
                tenant_id=int(tenant_id),
                key_id=None if key_id is None else int(key_id),
                at=datetime.fromtimestamp(at, UTC),
            )
        return BudgetUse(at, day, month)

    return _once_per_scope(count)


def refusal(decision: Decision, headers: dict[str, str], tier: str, max_tokens: int) -> Exception:
    """The HTTP error of a refused decision (the table in the module docstring); ``max_tokens``:
    what the request reserved for its completions, over all its choices and prompts."""
    message = decision.message
    if decision.limit == "max_tokens":  # the cap is on the total: say what was counted
        whose = "API key" if decision.scope == "key" else "organization"
        message = (
            f"This request's max_tokens, {max_tokens} over all its choices (n) and prompts, is above the "
            f"{whose}'s max_tokens per request."
        )
        return InvalidRequest(message, param="max_tokens", headers=headers)
    if decision.limit == "tier":  # the code tiers.py gives a tier the tenant may not use
        whose = "API key" if decision.scope == "key" else "organization"
        message = f"The {whose}'s quota does not allow service_tier {tier!r}."
        return PermissionDenied(message, param="service_tier", code="tier_not_allowed", headers=headers)
    if decision.limit in ("daily_budget", "monthly_budget"):
        return InsufficientQuota(message, headers=headers)
    return RateLimited(message, headers=headers)


class QuotaService:
    """admit/settle for one gateway replica (limits and counters live in Redis).

    Without a limiter only the key's enabled flag is checked (tools and tests that run no quotas).
    ``queues_lanes``: the limiter's Redis holds the lanes too, so an admission may queue the request.
    """

    def __init__(
        self, limiter: Limiter | None = None, *, queues_lanes: bool = False, tally: RefusalTally | None = None
    ) -> None:
        self.limiter = limiter
        self.tally = tally  # counts refusals into the hourly usage roll-ups
        self.queues_lanes = queues_lanes and limiter is not None
        self._open: dict[str, Admission] = {}  # request id → admission not yet settled
        self._renewer: asyncio.Task | None = None
        self._retries: set[asyncio.Task] = set()  # settlements Redis did not take yet

    @classmethod
    def open(cls, settings: ApiSettings, session_factory: sessionmaker[Session]) -> QuotaService:
        """A quota service on the quota Redis of ``settings`` (no I/O until the first request)."""
        url = settings.quota_redis_url or settings.redis_url
        limiter = Limiter(
            connect(url),
            keys=KeySpace(settings.quota_key_prefix),
            on_redis_error=settings.quota_on_redis_error,
            lease_ttl=settings.quota_lease_ttl_s,
            loader=tenancy_loader(session_factory),
            budget_loader=tenancy_budget_loader(session_factory),
        )
        return cls(limiter, queues_lanes=url == settings.redis_url, tally=RefusalTally(session_factory))

    async def answers(self) -> bool:
        """Whether the quota Redis answers a PING (True without quotas)."""
        if self.limiter is None:
            return True
        try:
            return bool(await self.limiter.redis.ping())
        except Exception:  # any failure: it does not answer
            return False

    async def admit(
        self,
        *,
        auth: AuthContext,
        request_id: str,
        tier: str,
        prompt_tokens: int,
        max_tokens: int,
        lane_entry: tuple[str, dict[str, str]] | None = None,
        worker_settles: bool = False,
    ) -> Admission:
        """Check and charge every limit of the key and its tenant, or raise the refusal's error.

        ``lane_entry`` (stream, fields): queue it with the admission when this service can
        (``Admission.queued``); otherwise the caller submits it after admission. A refusal queues
        nothing. ``worker_settles``: a queued entry also carries the reservation's settlement
        (quotas/settlement.py), which the worker runs with the request's last result
        (``Admission.worker_settles``).
        """
        if not auth.enabled:
            raise PermissionDenied("This API key is disabled.", code="key_disabled")
        admission = Admission(
            auth=auth, request_id=request_id, tier=tier, prompt_tokens=prompt_tokens, max_tokens=max_tokens
        )
        if self.limiter is None:
            return admission
        demand = Demand(str(auth.tenant_id), prompt_tokens, max_tokens, key=str(auth.key_id), tier=tier)
        enqueue = (
            Enqueue(*lane_entry, settlement=worker_settles)
            if lane_entry is not None and self.queues_lanes
            else None
        )
        with tracing.span("quota.admit"):
            try:
                decision = await self.limiter.admit(demand, enqueue=enqueue)
            except QuotaBackendUnavailable as exc:
                metrics.QUOTA_STORE_ERRORS.labels("closed").inc()
                tracing.set_attributes({"fairlane.quota.decision": "unavailable"})
                raise quota_unavailable(
                    "The quota service is unavailable, so the request was not admitted; retry shortly.",
                    retry_headers(exc.retry_after),
                ) from exc
            except QuotaNotConfigured as exc:
                raise quota_unavailable(f"Quotas are not configured: {exc}.") from exc
            if not decision.enforced:
                metrics.QUOTA_STORE_ERRORS.labels("open").inc()
            tracing.set_attributes(
                {
                    "fairlane.quota.decision": "allowed" if decision.allowed else "refused",
                    "fairlane.quota.limit": decision.limit,
                    "fairlane.lane.enqueued": decision.entry_id is not None,
                }
            )
        admission.headers = rate_limit_headers(decision)
        publish(admission.headers)
        if not decision.allowed:
            metrics.QUOTA_REFUSALS.labels(tier, decision.limit or "unknown").inc()
            if self.tally is not None:
                self.tally.note(auth.tenant_id, auth.key_id)
            raise refusal(decision, admission.headers, tier, max_tokens)
        admission.reservation, admission.decision = decision.reservation, decision
        admission.queued = decision.entry_id is not None
        admission.worker_settles = admission.queued and worker_settles
        if decision.reservation is not None and decision.reservation.charged:
            self._open[request_id] = admission
            self._start_renewer()
        return admission

    async def settle(self, admission: Admission, outcome: RequestOutcome) -> None:
        """Charge what the request used (``outcome.charged_tokens``), or refund it all if it did not
        run (``outcome.ran``); idempotent. Called by gateway/api/settle.py only. A request whose
        worker settled it with its last result (``outcome.quota_settled``) costs no round trip."""
        if admission.settled:
            return
        admission.settled = True
        self._open.pop(admission.request_id, None)
        metrics.QUOTA_SETTLEMENTS.labels(outcome.usage_status, "charged" if outcome.ran else "refunded").inc()
        reservation = admission.reservation
        if reservation is None or self.limiter is None:
            return
        if outcome.quota_settled and admission.worker_settles:
            return
        result = await self._settle_once(reservation, outcome)
        if result == "settled" and not outcome.ran and admission.decision is not None:
            # refunded: an error answered from here on shows the rates with this request given back
            admission.headers = rate_limit_headers(refunded(admission.decision, reservation.reserved_tokens))
            publish(admission.headers)
        if result == "unavailable":
            task = asyncio.ensure_future(self._settle_later(admission.request_id, reservation, outcome))
            self._retries.add(task)
            task.add_done_callback(self._retries.discard)
        elif result == "unknown" and admission.worker_settles:
            # its worker settled it with a last result this relay did not read (the client left)
            log.debug("quota settlement of %s: settled by its worker", admission.request_id)
        elif result not in ("settled", "not_charged"):
            log.warning("quota settlement of %s: %s", admission.request_id, result)

    async def _settle_once(self, reservation: Reservation, outcome: RequestOutcome) -> SettleOutcome:
        assert self.limiter is not None
        if outcome.ran:
            return await self.limiter.settle(reservation, outcome.charged_tokens)
        return await self.limiter.refund(reservation)

    async def _settle_later(self, request_id: str, reservation: Reservation, outcome: RequestOutcome) -> None:
        """Settle again every SETTLE_RETRY_S until Redis answers, for SETTLE_RETRY_FOR_S at most (a
        settlement applied whose answer was lost comes back ``unknown``: nothing is charged twice)."""
        deadline = time.monotonic() + SETTLE_RETRY_FOR_S
        while time.monotonic() < deadline:
            await asyncio.sleep(SETTLE_RETRY_S)
            result = await self._settle_once(reservation, outcome)
            if result != "unavailable":
                log.info("quota settlement of %s taken on a later try: %s", request_id, result)
                return
        log.warning(
            "quota settlement of %s abandoned after %.0f s: its slot is held until its lease expires",
            request_id,
            SETTLE_RETRY_FOR_S,
        )

    async def aclose(self) -> None:
        """Stop renewing leases and retrying settlements, and wait for the limiter's background
        refunds (at shutdown)."""
        for task in list(self._retries):
            task.cancel()
        await asyncio.gather(*self._retries, return_exceptions=True)
        if self._renewer is not None:
            self._renewer.cancel()
            await asyncio.gather(self._renewer, return_exceptions=True)
            self._renewer = None
        if self.tally is not None:
            await self.tally.aclose()
        if self.limiter is not None:
            await self.limiter.aclose()
            await self.limiter.redis.aclose()

    def _start_renewer(self) -> None:
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.get_running_loop().create_task(self._renew_leases())

    async def _renew_leases(self) -> None:
        """Every lease_ttl / 3, extend the leases of admissions older than that (long streams)."""
        assert self.limiter is not None
        every = self.limiter.lease_ttl / 3
        while True:
            await asyncio.sleep(every)
            cutoff = time.monotonic() - every
            due = [a for a in self._open.values() if a.admitted_at <= cutoff and a.reservation is not None]
            results = await asyncio.gather(
                *(self.limiter.renew(a.reservation) for a in due), return_exceptions=True
            )
            for admission, result in zip(due, results):
                if isinstance(result, BaseException):
                    log.warning("quota lease renewal of %s failed: %s", admission.request_id, result)


async def get_quota_service(request: Request) -> QuotaService:  # async: no thread pool hop
    return request.app.state.gateway.quota_service


QuotaDep = Annotated[QuotaService, Depends(get_quota_service)]
