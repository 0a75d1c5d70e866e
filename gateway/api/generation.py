"""One generation from the gateway's side: check, admit, queue in a lane, relay results, settle.

Shared by the chat and completions routes, streamed or not. ``start`` resolves max_tokens, checks
prompt + max_tokens against the context and builds the engine's SamplingParams once, all before
the quota admission; it returns only once the first result is back, so a request the worker
refuses (its SLO, a stop token the model lacks…) still gets a proper 4xx instead of a broken stream.

A relay that fails ends with an error, never silently: no result for ``stream_idle_timeout_s``
(status ``timeout``), Redis unreachable or the request lost by a restarted Redis (status
``interrupted``, 503). The quota is settled and the usage record written all the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

import anyio
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind
from sqlalchemy.exc import IntegrityError
from starlette.concurrency import run_in_threadpool

from engine import InvalidRequestError, SamplingParams
from gateway.api.auth import AuthContext
from gateway.api.errors import (
    SLO_UNATTAINABLE,
    GatewayError,
    GatewayTimeout,
    InvalidRequest,
    NotFound,
    ServiceUnavailable,
    SLOUnattainable,
    context_length_exceeded,
    engine_timeout,
    no_worker,
)
from gateway.api.model_selection import adapter_model_name
from gateway.api.quota_seam import Admission, QuotaSeam, never_ran
from gateway.api.request_telemetry import finish_request, request_attributes, status_of
from gateway.api.state import GatewayState
from gateway.lanes.client import QueueUnavailable, ResultTimeout
from gateway.lanes.messages import LaneAdapter, LaneRequest, LaneResult
from gateway.settings import ApiSettings
from gateway.telemetry import metrics, tracing
from tenancy import record_usage

log = logging.getLogger(__name__)
MODEL_NOT_FOUND = "model_not_found"  # a worker's error code: the request's adapter is gone from the store
INTERRUPTED = "interrupted"  # usage status (and error code) of a request cut by a Redis outage
TIMEOUT = "timeout"  # usage status of a request whose results stopped coming


def queue_lost(detail: object) -> ServiceUnavailable:
    return ServiceUnavailable(
        f"The request was interrupted: the request queue became unavailable ({detail}). Retry it.",
        code=INTERRUPTED,
        headers={"retry-after": "2"},
    )


def slo_targets(auth: AuthContext, tier: str, settings: ApiSettings) -> tuple[float | None, float | None]:
    """The request's (TTFT, TPOT) targets in seconds: the tenant's own, else its tier's; None: none."""
    tier_ttft, tier_tpot = settings.slo_targets(tier)
    return auth.ttft_target_s or tier_ttft, auth.tpot_target_s or tier_tpot


def lane_error(result: LaneResult, prompt_param: str = "messages") -> GatewayError:
    """The HTTP error of a worker's error result: 503 + retry-after for an SLO refusal, else 400."""
    if result.error_code == SLO_UNATTAINABLE:
        return SLOUnattainable(
            result.error_message or "The request cannot meet its latency target now.",
            retry_after_s=result.retry_after_s or 1.0,
        )
    if result.error_code == MODEL_NOT_FOUND:  # its adapter was deleted while the request waited in its lane
        return NotFound(
            result.error_message or "The model does not exist.", param="model", code=MODEL_NOT_FOUND
        )
    return InvalidRequest(
        result.error_message or "The engine refused the request.",
        param=prompt_param if result.error_param == "prompt" else result.error_param,
        code=result.error_code,
    )


def error_status(result: LaneResult) -> str:
    """The usage status of a request that ended with an error result."""
    return SLO_UNATTAINABLE if result.error_code == SLO_UNATTAINABLE else "error"


@dataclass
class Relay:
    """One engine request of a Generation (one prompt): its lane results and its own counts.

    Its choices are ``offset .. offset + n - 1`` of the response (OpenAI's ``prompt_index * n + choice``).
    """

    request_id: str
    offset: int
    first: LaneResult | None
    results: AsyncIterator[LaneResult | None]
    prompt_tokens: int
    choice_tokens: dict[int, int] = field(default_factory=dict)  # output tokens per choice index
    cached_tokens: int = 0  # prompt tokens the worker found in its prefix cache
    prompt_logprobs: tuple | None = None  # the prompt's TokenLogprobs (first None), when asked for
    done: bool = False
    ran: bool = False  # a result (not an error) came back: its prompt was computed

    @property
    def completion_tokens(self) -> int:
        return sum(self.choice_tokens.values())


@dataclass
class Generation:
    """One HTTP request's generation: one quota admission and one engine request per prompt
    (``relays``: one, except for a completions request with several prompts)."""

    state: GatewayState
    quota: QuotaSeam
    admission: Admission
    request_id: str
    model: str
    tier: str
    relays: list[Relay]
    started: float = field(default_factory=time.monotonic)
    created: int = field(default_factory=lambda: int(time.time()))
    first_token_at: float | None = None
    finish_reason: str | None = None
    closed: bool = False
    span: Span | None = None  # the gateway's request span (None while tracing is off)
    relay_span: Span | None = None
    last_token_at: float | None = None
    failure: str | None = None  # why the relay stopped before the end (a usage status)

    @property
    def done(self) -> bool:
        return all(relay.done for relay in self.relays)

    @property
    def prompt_tokens(self) -> int:
        return sum(relay.prompt_tokens for relay in self.relays)

    @property
    def completion_tokens(self) -> int:  # n > 1: every choice's tokens; the prompt counts once
        return sum(relay.completion_tokens for relay in self.relays)

    @property
    def cached_tokens(self) -> int:
        return sum(relay.cached_tokens for relay in self.relays)

    def prompt_index(self, index: int) -> int:
        """The position in the request's prompts of the prompt that choice ``index`` continues."""
        return next(i for i in range(len(self.relays) - 1, -1, -1) if self.relays[i].offset <= index)

    def prompt_logprobs(self, index: int) -> tuple | None:
        """The prompt logprobs (first None) of the prompt that choice ``index`` continues, when asked for."""
        return self.relays[self.prompt_index(index)].prompt_logprobs

    async def __aiter__(self) -> AsyncIterator[LaneResult | None]:
        """Every result of every prompt, the first ones included, its ``index`` that of the
        response's choice, and ``None`` as a keep-alive while none comes; records token counts and
        token timing as they pass. Several prompts: their results in the order they come."""
        if len(self.relays) == 1:
            async for result in self._relay(self.relays[0]):
                yield result
            return
        streams = [self._relay(relay).__aiter__() for relay in self.relays]
        pending = {asyncio.ensure_future(anext(stream)): i for i, stream in enumerate(streams)}
        try:
            while pending:
                ready, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in sorted(ready, key=pending.__getitem__):
                    i = pending.pop(task)
                    try:
                        result = task.result()
                    except StopAsyncIteration:
                        continue
                    pending[asyncio.ensure_future(anext(streams[i]))] = i
                    yield result
        finally:
            for task in pending:
                task.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.gather(*pending, return_exceptions=True)
                for stream in streams:
                    with contextlib.suppress(Exception):
                        await stream.aclose()

    async def _relay(self, relay: Relay) -> AsyncIterator[LaneResult | None]:
        try:
            result, relay.first = relay.first, None
            while True:
                if result is None:
                    yield None
                    result = await anext(relay.results)
                    continue
                if result.kind == "error":  # e.g. refused at a step start after a worker took it over
                    relay.done = True
                    self.finish_reason = error_status(result)
                    raise lane_error(result)
                relay.ran = True
                if result.token_ids:
                    now = time.monotonic()
                    if self.first_token_at is None:
                        self.first_token_at = now
                    else:
                        metrics.INTER_TOKEN.labels(self.tier).observe(
                            (now - self.last_token_at) / len(result.token_ids)
                        )
                    self.last_token_at = now
                relay.prompt_tokens = result.num_prompt_tokens or relay.prompt_tokens
                relay.choice_tokens[result.index] = max(
                    relay.choice_tokens.get(result.index, 0), result.num_output_tokens
                )
                if result.index == 0:  # the prompt's own (choices > 0 share its blocks by design)
                    relay.cached_tokens = max(relay.cached_tokens, result.num_cached_tokens)
                if result.prompt_logprobs is not None and relay.prompt_logprobs is None:
                    relay.prompt_logprobs = result.prompt_logprobs
                if result.finished:
                    relay.done = True
                    if self.done:
                        self.finish_reason = result.finish_reason
                yield replace(result, index=relay.offset + result.index) if relay.offset else result
                if result.finished:
                    return
                result = await anext(relay.results)
        except ResultTimeout as exc:
            self.failure = TIMEOUT
            raise engine_timeout(exc) from exc
        except QueueUnavailable as exc:
            self.failure = INTERRUPTED
            raise queue_lost(exc) from exc

    async def close(self) -> None:
        """Cancel what is unfinished, settle quotas and write the usage record (shielded: runs even
        when the client has gone and this task is being cancelled). The prompts of engine requests
        that never ran are refunded."""
        if self.closed:
            return
        self.closed = True
        with anyio.CancelScope(shield=True):
            status = self.finish_reason if self.done else (self.failure or "cancelled")
            for relay in self.relays:
                if not relay.done or status == INTERRUPTED:
                    self.state.lanes.cancel_soon(relay.request_id)
            ran_prompt_tokens = sum(relay.prompt_tokens for relay in self.relays if relay.ran)
            await self.quota.settle(
                self.admission,
                completion_tokens=self.completion_tokens,
                status=status,
                prompt_tokens=ran_prompt_tokens,
            )
            for relay in self.relays:
                await _quietly(self.state.lanes.discard(relay.request_id))
            await _record(
                self.state,
                self.admission,
                request_id=self.request_id,
                model=self.model,
                tier=self.tier,
                status=status,
                prompt_tokens=ran_prompt_tokens,
                completion_tokens=self.completion_tokens,
                started=self.started,
                first_token_at=self.first_token_at,
            )
            if self.relay_span is not None:
                self.relay_span.set_attribute("gen_ai.usage.output_tokens", self.completion_tokens)
                self.relay_span.end()
            status = status or "unknown"
            finish_request(
                span=self.span,
                tenant_label=self.state.settings.metrics_tenant_label,
                request_id=self.request_id,
                auth=self.admission.auth,
                tier=self.tier,
                model=self.model,
                status=status,
                prompt_tokens=0 if never_ran(status, self.completion_tokens) else ran_prompt_tokens,
                completion_tokens=self.completion_tokens,
                started=self.started,
                first_token_at=self.first_token_at,
                ran=True,
            )


async def _quietly(call) -> None:
    """A Redis call that may fail during an outage without failing the request's bookkeeping
    (a cancel mark or a result stream left behind expires after result_ttl_s)."""
    try:
        await call
    except Exception as exc:
        log.warning("redis call skipped during an outage: %s", exc)


def resolve_max_tokens(
    requested: int | None, *, prompt_tokens: int, max_model_len: int | None, default: int, cap: int | None
) -> int:
    """The request's max_tokens: the client's, else the server default, lowered to the context left
    and to the quota's per-request cap (a cap of 0 is left for the quota to refuse)."""
    if requested is not None:
        return requested
    max_tokens = default
    if max_model_len is not None:
        max_tokens = min(max_tokens, max_model_len - prompt_tokens)
    if cap is not None:
        max_tokens = min(max_tokens, cap)
    return max(1, max_tokens)


def sampling_params(options: dict[str, Any], max_tokens: int) -> SamplingParams:
    """The engine's SamplingParams of a request, built once; its own checks answer 400."""
    try:
        return SamplingParams(max_tokens=max_tokens, **options)
    except InvalidRequestError as exc:
        raise InvalidRequest(exc.message, param=exc.param) from exc


async def start(
    state: GatewayState,
    quota: QuotaSeam,
    auth: AuthContext,
    *,
    request_id: str,
    tier: str,
    prompts: list[list[int]],
    requested_max_tokens: int | None,
    sampling_options: dict[str, Any],
    prompt_param: str = "messages",
    traceparent: str | None = None,
    adapter: LaneAdapter | None = None,
) -> Generation:
    """Check, admit and queue a request, and wait for its first result (raising its error, if any).
    ``prompts``: token ids of each prompt (several only on completions), each its own engine
    request, all under one quota admission; ``adapter``: the tenant's LoRA adapter it runs with
    (gateway/api/model_selection.py).

    Everything that can refuse the request from what it asks (no worker, the context, the sampling
    options) runs before the quota admission: such a refusal charges nothing and queues nothing.
    Every refusal is counted and logged here (a Generation reports its own end in close()).
    """
    started = time.monotonic()  # TTFT and latency count the time spent queued
    span = trace.get_current_span() if tracing.enabled() else None
    try:
        return await _start(
            state,
            quota,
            auth,
            request_id=request_id,
            tier=tier,
            prompts=prompts,
            requested_max_tokens=requested_max_tokens,
            sampling_options=sampling_options,
            prompt_param=prompt_param,
            traceparent=traceparent,
            started=started,
            span=span,
            adapter=adapter,
        )
    except GatewayError as exc:
        if not getattr(exc, "reported", False):
            finish_request(
                span=span,
                tenant_label=state.settings.metrics_tenant_label,
                request_id=request_id,
                auth=auth,
                tier=tier,
                model=state.settings.model_name,
                status=status_of(exc),
                prompt_tokens=0,
                completion_tokens=0,
                started=started,
            )
        raise


def relay_ids(request_id: str, count: int) -> list[str]:
    """The engine request ids of a request's prompts: its own id for one prompt, ``id-i`` for several."""
    return [request_id] if count == 1 else [f"{request_id}-{i}" for i in range(count)]


async def _first_results(
    streams: list[AsyncIterator[LaneResult | None]], got: dict[int, LaneResult]
) -> list[LaneResult]:
    """The first result of each stream (keep-alives skipped), waited for together; each lands in
    ``got`` (stream position → result) as it comes, so that a failure knows which prompts ran."""

    async def first(i: int, stream: AsyncIterator[LaneResult | None]) -> LaneResult:
        result = await anext(stream)
        while result is None:  # keep-alives before the first result: a response has not started
            result = await anext(stream)
        got[i] = result
        return result

    if len(streams) == 1:
        return [await first(0, streams[0])]
    tasks = [asyncio.ensure_future(first(i, stream)) for i, stream in enumerate(streams)]
    try:
        return list(await asyncio.gather(*tasks))
    finally:  # one failed, or the client left: the others stop waiting
        for task in tasks:
            task.cancel()


async def _start(
    state: GatewayState,
    quota: QuotaSeam,
    auth: AuthContext,
    *,
    request_id: str,
    tier: str,
    prompts: list[list[int]],
    requested_max_tokens: int | None,
    sampling_options: dict[str, Any],
    prompt_param: str,
    traceparent: str | None,
    started: float,
    span: Span | None,
    adapter: LaneAdapter | None = None,
) -> Generation:
    settings, model = state.settings, state.settings.model_name
    shown = model if adapter is None else adapter_model_name(model, adapter.name)  # responses and usage
    if not await state.lanes.has_worker(model):
        raise no_worker(model)
    max_model_len = await state.max_model_len()
    choices = sampling_options.get("n", 1) * len(prompts)  # a quota's max_tokens cap is on their total
    samplings: list[SamplingParams] = []
    for i, prompt_ids in enumerate(prompts):
        max_tokens = resolve_max_tokens(
            requested_max_tokens,
            prompt_tokens=len(prompt_ids),
            max_model_len=max_model_len,
            default=settings.max_tokens_default,
            cap=auth.max_tokens_cap and auth.max_tokens_cap // choices,
        )
        if max_model_len is not None and len(prompt_ids) + max_tokens > max_model_len:
            error = context_length_exceeded(max_model_len, len(prompt_ids), max_tokens, prompt_param)
            if len(prompts) > 1:
                error.message = f"Prompt {i}: {error.message}"
            raise error
        if not samplings or samplings[-1].max_tokens != max_tokens:
            samplings.append(sampling_params(sampling_options, max_tokens))
        else:
            samplings.append(samplings[-1])
    sampling = samplings[0]
    prompt_tokens = sum(len(p) for p in prompts)
    ttft_target, tpot_target = slo_targets(auth, tier, settings)
    gate = ttft_target is not None and settings.slo_gate and not settings.engine.slo_demote
    if span is not None:  # the workers' spans join this trace: the lane carries this span's context
        span.set_attributes(
            {
                k: v
                for k, v in request_attributes(
                    auth=auth,
                    tier=tier,
                    model=model,
                    max_tokens=sampling.max_tokens,
                    temperature=sampling.temperature,
                    top_p=sampling.top_p,
                    prompt_param=prompt_param,
                ).items()
                if v is not None
            }
        )
        span.set_attribute("gen_ai.usage.input_tokens", prompt_tokens)
        traceparent = tracing.inject() or traceparent
    ids = relay_ids(request_id, len(prompts))
    lane_requests = [
        LaneRequest(
            request_id=rid,
            model=model,
            tier=tier,
            tenant=str(auth.tenant_id),
            prompt_token_ids=tuple(prompt_ids),
            sampling=p,
            weight=auth.weight,
            ttft_target_s=ttft_target,
            tpot_target_s=tpot_target,
            traceparent=traceparent,
            lora=adapter,
        )
        for rid, prompt_ids, p in zip(ids, prompts, samplings)
    ]
    epoch = await state.lanes.epoch()  # cached: a Redis restarted empty while it waits is noticed
    # When quotas and lanes share a Redis the admission queues a one-prompt request too (one round
    # trip), unless the SLO door check has to come between the two.
    one_entry = len(lane_requests) == 1 and not gate
    try:
        admission = await quota.admit(
            auth=auth,
            request_id=request_id,
            tier=tier,
            prompt_tokens=prompt_tokens,
            # every choice may use all of its max_tokens
            max_tokens=sum(p.max_tokens * p.n for p in samplings),
            lane_entry=state.lanes.entry(lane_requests[0]) if one_entry else None,
        )
    except GatewayError:
        tracing.set_attributes({"fairlane.quota.decision": "refused"}, span)
        raise  # refused, or the quota backend is down: nothing was queued
    except BaseException:
        # Cancelled (the client left) or failed on the way: the limiter refunds what it may have
        # charged; the request may be in its lane already, so tell the workers to drop it.
        with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
            await state.lanes.cancel(request_id)
        raise
    relay_span = None
    got: dict[int, LaneResult] = {}  # the first results that came back
    try:
        if gate:
            with tracing.span("slo_gate"):
                try:
                    predicted = await state.slo_gate.check(
                        tier=tier, prompt_tokens=prompt_tokens, ttft_target_s=ttft_target
                    )
                except SLOUnattainable:
                    tracing.set_attributes({"fairlane.slo.verdict": "refused"})
                    tracing.set_attributes({"fairlane.slo.verdict": "refused"}, span)
                    raise
                verdict = {
                    "fairlane.slo.verdict": "admitted",
                    "fairlane.slo.predicted_ttft_s": predicted,
                    "fairlane.slo.ttft_target_s": ttft_target,
                }
                tracing.set_attributes(verdict)
                tracing.set_attributes(verdict, span)
        if not admission.queued:
            with tracing.span("lane.enqueue", kind=SpanKind.PRODUCER, attributes={"fairlane.tier": tier}):
                for lane_request in lane_requests:
                    await state.lanes.submit(lane_request)
        for prompt_ids in prompts:
            state.slo_gate.note_queued(tier, len(prompt_ids))
        if span is not None:
            relay_span = tracing.tracer().start_span("lane.relay")
        streams = [
            state.lanes.results(
                rid,
                timeout_s=settings.request_timeout_s,
                idle_timeout_s=settings.stream_idle_timeout_s,
                keepalive_s=settings.sse_keepalive_s,
                epoch=epoch,
            ).__aiter__()
            for rid in ids
        ]
        try:
            firsts = await _first_results(streams, got)
        except ResultTimeout as exc:
            raise engine_timeout(exc) from exc
        except QueueUnavailable as exc:
            raise queue_lost(exc) from exc
    except SLOUnattainable:  # refused at the door: nothing was queued, nothing is charged
        with anyio.CancelScope(shield=True):
            await quota.settle(admission, completion_tokens=0, status=SLO_UNATTAINABLE)
            await _record(
                state,
                admission,
                request_id=request_id,
                model=shown,
                tier=tier,
                status=SLO_UNATTAINABLE,
                prompt_tokens=0,
                completion_tokens=0,
                started=started,
            )
        raise
    except (
        BaseException
    ) as exc:  # admitted, then not every first result: what ran is charged, the rest refunded
        if relay_span is not None:
            relay_span.end()
        status = (
            INTERRUPTED
            if getattr(exc, "code", None) == INTERRUPTED
            else TIMEOUT
            if isinstance(exc, GatewayTimeout)
            else "error"
            if isinstance(exc, Exception)
            else "cancelled"
        )
        ran = [result for result in got.values() if result.kind != "error"]  # one prompt: none
        prompt_ran = sum(result.num_prompt_tokens for result in ran)
        completion = sum(result.num_output_tokens for result in ran)
        with anyio.CancelScope(shield=True):
            for rid in ids:
                state.lanes.cancel_soon(rid)
            await quota.settle(
                admission, completion_tokens=completion, status="error", prompt_tokens=prompt_ran
            )
            await _record(
                state,
                admission,
                request_id=request_id,
                model=shown,
                tier=tier,
                status=status,
                prompt_tokens=prompt_ran,
                completion_tokens=completion,
                started=started,
            )
        raise
    n = sampling.n
    relays = [
        Relay(request_id=rid, offset=i * n, first=first, results=stream, prompt_tokens=len(prompt_ids))
        for i, (rid, first, stream, prompt_ids) in enumerate(zip(ids, firsts, streams, prompts))
    ]
    generation = Generation(
        state=state,
        quota=quota,
        admission=admission,
        request_id=request_id,
        model=shown,
        tier=tier,
        relays=relays,
        started=started,
        span=span,
        relay_span=relay_span,
    )
    tracing.set_attributes({"fairlane.quota.decision": "allowed"}, span)
    refused = next((first for first in firsts if first.kind == "error"), None)
    if refused is not None:  # refused by the worker (bad input, or its SLO): refunded in close()
        for relay in relays:
            relay.done = relay.first.kind == "error"
            relay.ran = not relay.done
            if relay.ran:  # what its first result counted is charged
                relay.choice_tokens[relay.first.index] = relay.first.num_output_tokens
        generation.finish_reason = generation.failure = error_status(refused)
        await generation.close()
        error = lane_error(refused, prompt_param)
        error.reported = True  # close() counted and logged it
        raise error
    return generation


async def _record(
    state: GatewayState,
    admission: Admission,
    *,
    request_id: str,
    model: str,
    tier: str,
    status: str | None,
    prompt_tokens: int,
    completion_tokens: int,
    started: float,
    first_token_at: float | None = None,
) -> None:
    now = time.monotonic()
    auth = admission.auth
    status = status or "unknown"

    def write() -> None:
        with state.session_factory() as session:
            try:
                record_usage(
                    session,
                    request_id=request_id,
                    tenant_id=auth.tenant_id,
                    key_id=auth.key_id,
                    model=model,
                    tier=tier,
                    prompt_tokens=0 if never_ran(status, completion_tokens) else prompt_tokens,
                    completion_tokens=completion_tokens,
                    status=status,
                    ttft_ms=(first_token_at - started) * 1000 if first_token_at else None,
                    latency_ms=(now - started) * 1000,
                )
            except IntegrityError:  # already recorded
                session.rollback()

    try:
        await run_in_threadpool(write)
    except Exception:  # usage is bookkeeping: never fail the response because of it
        log.exception("could not record usage of %s", request_id)
