"""The one place where a request's life on the gateway ends: from its ``RequestOutcome``, settle
its quota, report it (metrics, span, log line) and write its usage record, in that order.

The usage record is a database transaction (an insert and the hourly roll-up), shared by the
records of requests that end within a few milliseconds (gateway/api/usage_writer.py), the costliest
step of a short request's path. A JSON response waits for neither it nor the report: with
``defer`` the caller gets both back and runs them once the response is sent (a Starlette
background task, which runs right after the body is sent and before the ASGI call returns, so the
request's span is still open); the latency reported and recorded is still the one at settlement.
The quota is settled before any response, so a client's next request finds its concurrency slot
free.

``settle`` runs once per request, shielded from cancellation (the client may be gone): by the
relay when it closes (gateway/api/relay.py), or by the admission when the request fails before
its first results (gateway/api/admit.py). A request refused or cancelled before admission has
nothing to settle or record: only its report is written.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio
from opentelemetry.trace import Span

from gateway.api.auth import AuthContext
from gateway.api.outcome import RequestOutcome
from gateway.api.quota_service import Admission, QuotaService
from gateway.api.request_telemetry import finish_request
from gateway.api.state import GatewayState


@dataclass
class RequestContext:
    """What every stage of one request knows about it: who asked, for what, since when."""

    state: GatewayState
    quota: QuotaService
    auth: AuthContext
    request_id: str
    model: str  # as responses and usage name it (``base:adapter`` for an adapter)
    tier: str
    span: Span | None = None  # the gateway's request span (None while tracing is off)
    started: float = field(default_factory=time.monotonic)  # TTFT and latency count time queued
    admission: Admission | None = None  # None until the quota let it in


Deferred = Callable[[], Awaitable[None]]


async def settle(context: RequestContext, outcome: RequestOutcome, *, defer: bool = False) -> Deferred | None:
    """Settle the quota, report the request and record its usage, all from ``outcome``.
    ``defer``: return the report and the usage write, to run once the response is sent, instead
    of running them now."""
    with anyio.CancelScope(shield=True):
        if context.admission is not None:
            await context.quota.settle(context.admission, outcome)
        ended = time.monotonic()
        if defer:
            return _report_and_record(context, outcome, ended)
        await _report_and_record(context, outcome, ended)()
    return None


def _report_and_record(context: RequestContext, outcome: RequestOutcome, ended: float) -> Deferred:
    """The request's report (metrics, span, log line) and its usage record, as of ``ended``; its
    callers (``settle``, ``Generation.finish``) run it shielded from cancellation."""

    async def run() -> None:
        finish_request(
            span=context.span,
            tenant_label=context.state.settings.metrics_tenant_label,
            request_id=context.request_id,
            auth=context.auth,
            tier=context.tier,
            model=context.model,
            status=outcome.usage_status,
            prompt_tokens=outcome.charged_prompt_tokens,
            completion_tokens=outcome.completion_tokens,
            started=context.started,
            ended=ended,
            first_token_at=outcome.first_token_at,
            ran=context.admission is not None,
        )
        if context.admission is not None:
            await context.state.usage.write(_usage_row(context, outcome, ended))

    return run


def _usage_row(context: RequestContext, outcome: RequestOutcome, ended: float) -> dict:
    """The request's usage record (written by the replica's UsageWriter, in a batch with the
    records of requests that ended meanwhile)."""
    latency_ms = (ended - context.started) * 1000
    ttft_ms = None if outcome.first_token_at is None else (outcome.first_token_at - context.started) * 1000
    auth = context.auth
    return dict(
        request_id=context.request_id,
        tenant_id=auth.tenant_id,
        key_id=auth.key_id,
        model=context.model,
        tier=context.tier,
        prompt_tokens=outcome.charged_prompt_tokens,
        completion_tokens=outcome.completion_tokens,
        status=outcome.usage_status,
        ttft_ms=ttft_ms,
        latency_ms=latency_ms,
    )
