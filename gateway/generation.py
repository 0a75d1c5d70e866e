"""One generation from the gateway's side: admit, queue in a lane, relay results, settle.

Shared by the chat and completions routes, streamed or not. ``start`` returns only once the
first result is back, so a request the worker refuses (prompt over the context…) still gets a
proper 4xx instead of a broken stream.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import anyio
from sqlalchemy.exc import IntegrityError
from starlette.concurrency import run_in_threadpool

from gateway.auth import AuthContext
from gateway.errors import GatewayError, GatewayTimeout, InvalidRequest, ServiceUnavailable, SLOUnattainable
from gateway.lanes import ResultTimeout
from gateway.messages import LaneRequest, LaneResult, SamplingSpec
from gateway.quota_seam import SLO_REFUSED, Admission, QuotaSeam, never_ran
from gateway.settings import Settings
from gateway.state import GatewayState
from tenancy import record_usage

log = logging.getLogger(__name__)


def slo_targets(auth: AuthContext, tier: str, settings: Settings) -> tuple[float | None, float | None]:
    """The request's (TTFT, TPOT) targets in seconds: the tenant's own, else its tier's; None: none."""
    tier_ttft, tier_tpot = settings.slo_targets(tier)
    return auth.ttft_target_s or tier_ttft, auth.tpot_target_s or tier_tpot


def lane_error(result: LaneResult, prompt_param: str = "messages") -> GatewayError:
    """The HTTP error of a worker's error result: 503 + retry-after for an SLO refusal, else 400."""
    if result.error_code == SLO_REFUSED:
        return SLOUnattainable(result.error_message or "The request cannot meet its latency target now.",
                               retry_after_s=result.retry_after_s or 1.0)
    return InvalidRequest(result.error_message or "The engine refused the request.",
                          param=prompt_param if result.error_param == "prompt" else result.error_param,
                          code=result.error_code)


@dataclass
class Generation:
    state: GatewayState
    quota: QuotaSeam
    admission: Admission
    request_id: str
    model: str
    tier: str
    first: LaneResult
    results: AsyncIterator[LaneResult]
    started: float = field(default_factory=time.monotonic)
    created: int = field(default_factory=lambda: int(time.time()))
    first_token_at: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    done: bool = False
    closed: bool = False

    async def __aiter__(self) -> AsyncIterator[LaneResult]:
        """Every result, the first included; records token counts as they pass."""
        try:
            result = self.first
            while True:
                if result.kind == "error":  # e.g. refused at a step start after a worker took it over
                    self.done = True
                    self.finish_reason = SLO_REFUSED if result.error_code == SLO_REFUSED else "error"
                    raise lane_error(result)
                if result.token_ids and self.first_token_at is None:
                    self.first_token_at = time.monotonic()
                self.prompt_tokens = result.num_prompt_tokens or self.prompt_tokens
                self.completion_tokens = max(self.completion_tokens, result.num_output_tokens)
                if result.finished:
                    self.finish_reason = result.finish_reason
                    self.done = True
                yield result
                if result.finished:
                    return
                result = await anext(self.results)
        except ResultTimeout as exc:
            raise GatewayTimeout(f"The engine did not answer in time: {exc}.") from exc

    async def close(self) -> None:
        """Cancel if unfinished, settle quotas and write the usage record (shielded: runs even when
        the client has gone and this task is being cancelled)."""
        if self.closed:
            return
        self.closed = True
        with anyio.CancelScope(shield=True):
            status = self.finish_reason if self.done else "cancelled"
            if not self.done:
                await self.state.lanes.cancel(self.request_id)
            await self.quota.settle(self.admission, completion_tokens=self.completion_tokens, status=status)
            await self.state.lanes.discard(self.request_id)
            await _record(self.state, self.admission, request_id=self.request_id, model=self.model, tier=self.tier,
                          status=status, prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens,
                          started=self.started, first_token_at=self.first_token_at)


async def start(state: GatewayState, quota: QuotaSeam, auth: AuthContext, *, request_id: str, tier: str,
                prompt_ids: list[int], requested_max_tokens: int | None, sampling_for,
                prompt_param: str = "messages", traceparent: str | None = None) -> Generation:
    """Admit and queue a request, and wait for its first result (raising its error, if any)."""
    started = time.monotonic()  # TTFT and latency count the time spent queued
    settings, model = state.settings, state.settings.model_name
    if not await state.lanes.has_worker(model):
        raise ServiceUnavailable(f"No engine worker is serving {model!r} right now; retry shortly.",
                                 headers={"retry-after": "5"})
    max_model_len = await state.max_model_len()
    if max_model_len is not None and len(prompt_ids) >= max_model_len:
        raise InvalidRequest(
            f"This model's maximum context length is {max_model_len} tokens, but the prompt has "
            f"{len(prompt_ids)} tokens.", param=prompt_param, code="context_length_exceeded",
        )
    max_tokens = requested_max_tokens or settings.max_tokens_default
    if requested_max_tokens is None:  # the default never asks more than the context or the quota allow
        if max_model_len is not None:
            max_tokens = min(max_tokens, max_model_len - len(prompt_ids))
        if auth.max_tokens_cap is not None:
            max_tokens = max(1, min(max_tokens, auth.max_tokens_cap))  # a cap of 0: refused below
    sampling: SamplingSpec = sampling_for(max_tokens=max_tokens)
    ttft_target, tpot_target = slo_targets(auth, tier, settings)
    gate = ttft_target is not None and settings.slo_gate and not settings.slo_demote
    lane_request = LaneRequest(request_id=request_id, model=model, tier=tier, tenant=auth.tenant_name,
                               prompt_token_ids=tuple(prompt_ids), sampling=sampling, weight=auth.weight,
                               ttft_target_s=ttft_target, tpot_target_s=tpot_target, traceparent=traceparent)
    # When quotas and lanes share a Redis the admission queues the request too (one round trip),
    # unless the SLO door check has to come between the two.
    try:
        admission = await quota.admit(auth=auth, request_id=request_id, tier=tier, prompt_tokens=len(prompt_ids),
                                      max_tokens=max_tokens,
                                      lane_entry=None if gate else state.lanes.entry(lane_request))
    except GatewayError:
        raise  # refused, or the quota backend is down: nothing was queued
    except BaseException:
        # Cancelled (the client left) or failed on the way: the limiter refunds what it may have
        # charged; the request may be in its lane already, so tell the workers to drop it.
        with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
            await state.lanes.cancel(request_id)
        raise
    try:
        if gate:
            await state.slo_gate.check(tier=tier, prompt_tokens=len(prompt_ids), ttft_target_s=ttft_target)
        if not admission.queued:
            await state.lanes.submit(lane_request)
        state.slo_gate.note_queued(tier, len(prompt_ids))
        results = state.lanes.results(request_id, timeout_s=settings.request_timeout_s).__aiter__()
        try:
            first = await anext(results)
        except ResultTimeout as exc:
            raise GatewayTimeout(f"The engine did not answer in time: {exc}.") from exc
    except SLOUnattainable as exc:  # refused at the door: nothing was queued, nothing is charged
        with anyio.CancelScope(shield=True):
            await quota.settle(admission, completion_tokens=0, status=SLO_REFUSED)
            await _record(state, admission, request_id=request_id, model=model, tier=tier, status=SLO_REFUSED,
                          prompt_tokens=0, completion_tokens=0, started=started)
        raise
    except BaseException:
        with anyio.CancelScope(shield=True):
            await state.lanes.cancel(request_id)
            await quota.settle(admission, completion_tokens=0, status="error")
        raise
    generation = Generation(state=state, quota=quota, admission=admission, request_id=request_id, model=model,
                            tier=tier, first=first, results=results, prompt_tokens=len(prompt_ids),
                            started=started)
    if first.kind == "error":  # refused by the worker (bad input, or its SLO): refunded in close()
        generation.done = True
        generation.finish_reason = SLO_REFUSED if first.error_code == SLO_REFUSED else "error"
        await generation.close()
        raise lane_error(first, prompt_param)
    return generation


async def _record(state: GatewayState, admission: Admission, *, request_id: str, model: str, tier: str,
                  status: str | None, prompt_tokens: int, completion_tokens: int, started: float,
                  first_token_at: float | None = None) -> None:
    now = time.monotonic()
    auth = admission.auth
    status = status or "unknown"

    def write() -> None:
        with state.session_factory() as session:
            try:
                record_usage(
                    session, request_id=request_id, tenant_id=auth.tenant_id, key_id=auth.key_id, model=model,
                    tier=tier, prompt_tokens=0 if never_ran(status, completion_tokens) else prompt_tokens,
                    completion_tokens=completion_tokens, status=status,
                    ttft_ms=(first_token_at - started) * 1000 if first_token_at else None,
                    latency_ms=(now - started) * 1000,
                )
            except IntegrityError:  # already recorded
                session.rollback()

    try:
        await run_in_threadpool(write)
    except Exception:  # usage is bookkeeping: never fail the response because of it
        log.exception("could not record usage of %s", request_id)
