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
from gateway.errors import GatewayError, GatewayTimeout, InvalidRequest, ServiceUnavailable
from gateway.lanes import ResultTimeout
from gateway.messages import LaneRequest, LaneResult, SamplingSpec
from gateway.quota_seam import Admission, QuotaSeam, never_ran
from gateway.state import GatewayState
from tenancy import record_usage

log = logging.getLogger(__name__)


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
            await _record(self, status)


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
    # Built before admission: when quotas and lanes share a Redis, the admission queues it too.
    lane_request = LaneRequest(request_id=request_id, model=model, tier=tier, tenant=auth.tenant_name,
                               prompt_token_ids=tuple(prompt_ids), sampling=sampling, weight=auth.weight,
                               traceparent=traceparent)
    try:
        admission = await quota.admit(auth=auth, request_id=request_id, tier=tier, prompt_tokens=len(prompt_ids),
                                      max_tokens=max_tokens, lane_entry=state.lanes.entry(lane_request))
    except GatewayError:
        raise  # refused, or the quota backend is down: nothing was queued
    except BaseException:
        # Cancelled (the client left) or failed on the way: the limiter refunds what it may have
        # charged; the request may be in its lane already, so tell the workers to drop it.
        with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
            await state.lanes.cancel(request_id)
        raise
    try:
        if not admission.queued:
            await state.lanes.submit(lane_request)
        results = state.lanes.results(request_id, timeout_s=settings.request_timeout_s).__aiter__()
        try:
            first = await anext(results)
        except ResultTimeout as exc:
            raise GatewayTimeout(f"The engine did not answer in time: {exc}.") from exc
    except BaseException:
        with anyio.CancelScope(shield=True):
            await state.lanes.cancel(request_id)
            await quota.settle(admission, completion_tokens=0, status="error")
        raise
    generation = Generation(state=state, quota=quota, admission=admission, request_id=request_id, model=model,
                            tier=tier, first=first, results=results, prompt_tokens=len(prompt_ids),
                            started=started)
    if first.kind == "error":
        generation.done, generation.finish_reason = True, "error"
        await generation.close()
        raise InvalidRequest(first.error_message or "The engine refused the request.",
                             param=prompt_param if first.error_param == "prompt" else first.error_param,
                             code=first.error_code)
    return generation


async def _record(generation: Generation, status: str) -> None:
    now = time.monotonic()
    auth = generation.admission.auth

    def write() -> None:
        with generation.state.session_factory() as session:
            try:
                record_usage(
                    session, request_id=generation.request_id, tenant_id=auth.tenant_id, key_id=auth.key_id,
                    model=generation.model, tier=generation.tier,
                    prompt_tokens=0 if never_ran(status, generation.completion_tokens) else generation.prompt_tokens,
                    completion_tokens=generation.completion_tokens, status=status or "unknown",
                    ttft_ms=(generation.first_token_at - generation.started) * 1000
                    if generation.first_token_at else None,
                    latency_ms=(now - generation.started) * 1000,
                )
            except IntegrityError:  # already recorded
                session.rollback()

    try:
        await run_in_threadpool(write)
    except Exception:  # usage is bookkeeping: never fail the response because of it
        log.exception("could not record usage of %s", generation.request_id)
