"""Start one generation from the gateway's side: check, admit, queue in a lane, wait for the first
results. Shared by the chat and completions routes, streamed or not.

``start`` reads top to bottom: the checks that charge nothing (a worker serves the model, each
prompt fits the context, the sampling options), the quota admission — which also writes the lane
entry when it can (``queue_with_admission``) — the SLO door check, the enqueue of whatever the
admission did not queue, and the first result of each prompt. It returns only once those are back,
so a request the worker refuses (its SLO, a stop token the model lacks…) still gets a proper 4xx
instead of a broken stream. Every way out settles the request's outcome once (gateway/api/settle.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import anyio
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from engine import EngineError, SamplingParams, check_context
from gateway.api.auth import AuthContext
from gateway.api.errors import (
    ClientClosedRequest,
    GatewayError,
    SLOUnattainable,
    no_worker,
    refused_by_engine_checks,
)
from gateway.api.first_results import (
    ClientGone,
    Failed,
    first_results,
    outcome_before_first_results,
    result_stream,
)
from gateway.api.model_selection import adapter_model_name
from gateway.api.outcome import RequestOutcome, Status
from gateway.api.prompts import relay_ids, resolve_max_tokens
from gateway.api.quota_service import QuotaService
from gateway.api.relay import Generation, Relay, lane_error, read_published, refusal_status
from gateway.api.request_telemetry import request_attributes, status_of
from gateway.api.settle import RequestContext, settle
from gateway.api.state import GatewayState
from gateway.lanes.messages import LaneAdapter, LaneRequest, LaneResult
from gateway.settings import ApiSettings
from gateway.telemetry import path_marks, tracing


@dataclass(frozen=True)
class GenerationRequest:
    """What a route asks to generate. ``prompts``: token ids of each prompt (several only on
    completions), each its own engine request, all under one quota admission; ``adapter``: the
    tenant's LoRA adapter it runs with (gateway/api/model_selection.py)."""

    request_id: str
    tier: str
    prompts: list[list[int]]
    requested_max_tokens: int | None
    sampling_options: dict[str, Any]
    prompt_param: str = "messages"  # the body field the prompt came in (error bodies name it)
    traceparent: str | None = None
    adapter: LaneAdapter | None = None
    # whether the client has gone (the request's ``is_disconnected``), asked while the first results
    # are awaited: a request whose client left before them is cancelled then, not once they come
    disconnected: Callable[[], Awaitable[bool]] | None = None
    structured_param: str | None = None  # where the output constraint came from, when not response_format


@dataclass(frozen=True)
class LanePlan:
    """The engine requests of one generation, checked and ready to queue."""

    lane_requests: list[LaneRequest]
    prompt_tokens: int
    reserved_tokens: int  # every choice may use all of its max_tokens
    ttft_target_s: float | None
    door_check: bool  # the SLO door check runs between admission and enqueue

    @property
    def sampling(self) -> SamplingParams:
        return self.lane_requests[0].sampling


async def start(
    state: GatewayState, quota: QuotaService, auth: AuthContext, ask: GenerationRequest
) -> Generation:
    """Check, admit and queue a request, and wait for its first results (raising its error, if any).

    Everything that can refuse the request from what it asks runs before the quota admission:
    such a refusal charges nothing and queues nothing; so does the overload bound (shedding.py)."""
    with state.admissions.held():
        return await _start(state, quota, auth, ask)


async def _start(
    state: GatewayState, quota: QuotaService, auth: AuthContext, ask: GenerationRequest
) -> Generation:
    model = state.settings.model_name
    shown = model if ask.adapter is None else adapter_model_name(model, ask.adapter.name)
    context = RequestContext(
        state,
        quota,
        auth,
        ask.request_id,
        model=shown,  # as responses and usage name it
        tier=ask.tier,
        span=trace.get_current_span() if tracing.enabled() else None,
    )
    try:
        state.admissions.check()  # over the replica's bound: Overloaded (503), before anything else
        plan = await _plan(state, auth, ask)
        traceparent = _annotate(context, plan, ask) or ask.traceparent
        plan = _with_traceparent(plan, traceparent)
        # One round trip for admission and enqueue when quotas and lanes share a Redis: the Lua
        # admission writes the lane entry, unless several prompts or the SLO door check must come first.
        queue_with_admission = len(plan.lane_requests) == 1 and not plan.door_check
        lane_entry = state.lanes.entry(plan.lane_requests[0]) if queue_with_admission else None
        epoch = await state.lanes.epoch()  # cached: a Redis restarted empty while it waits is noticed
        # One choice: the worker settles the quota with the last result, in the transaction that
        # publishes it (the charge is that result's prompt and output tokens), so the concurrency
        # slot is free before the response and the gateway needs no round trip of its own.
        worker_settles = queue_with_admission and plan.lane_requests[0].sampling.n == 1
        # An idle worker on this host starts the request while the admission queues it (hints.py).
        hinted = lane_entry is not None and state.lanes.hint(plan.lane_requests[0], *lane_entry)
        path_marks.mark("hinted")
        try:
            context.admission = await _admit(context, plan, lane_entry, worker_settles)
        except GatewayError as exc:  # refused (over a quota: its retry-after), or a backend is down
            if hinted:
                state.lanes.unhint(plan.lane_requests[0], refused_for_s=getattr(exc, "retry_after_s", 0.0))
            raise
        except BaseException:
            if hinted:
                state.lanes.unhint(plan.lane_requests[0])
            raise
    except GatewayError as exc:  # refused, or a backend is down: nothing was charged or queued
        await settle(context, RequestOutcome(Status.REFUSED, error_code=status_of(exc)))
        raise
    except asyncio.CancelledError as exc:
        if context.admission is not None:  # admitted as the client left (_admit)
            await _settle_before_first_results(context, plan, exc, {})
        else:  # cut before its admission (the server stopping): nothing charged or queued, reported
            await settle(context, RequestOutcome(Status.CANCELLED_BEFORE_FIRST_TOKEN))
        raise
    path_marks.mark("admitted")
    got: dict[int, LaneResult] = {}  # the first results that came back, by prompt
    relay_span = None
    try:
        if plan.door_check:
            await _door_check(context, plan)
        if not context.admission.queued:
            await _submit(state, plan)
        for lane_request in plan.lane_requests:  # backlog for the door check until its next read
            state.slo_gate.note_queued(ask.tier, len(lane_request.prompt_token_ids))
        if context.span is not None:
            relay_span = tracing.tracer().start_span("lane.relay")
        streams = [result_stream(state, r.request_id, epoch) for r in plan.lane_requests]
        firsts = await first_results(state, streams, got, ask.disconnected)
        path_marks.mark("first_results")
    except BaseException as exc:  # admitted, then not every first result: what ran is charged
        if relay_span is not None:
            relay_span.end()
        await _settle_before_first_results(context, plan, exc, got)
        if isinstance(exc, Failed):
            raise exc.error from exc.__cause__
        if isinstance(exc, ClientGone):
            raise ClientClosedRequest("The client closed the request before its first results.") from None
        raise
    tracing.set_attributes({"fairlane.quota.decision": "allowed"}, context.span)
    generation = Generation(context=context, relays=_relays(plan, firsts, streams), relay_span=relay_span)
    refused = next((first for first in firsts if first.kind == "error"), None)
    if refused is not None:  # refused by the worker (bad input, or its SLO): settled by close()
        generation.failure = refusal_status(refused)
        await generation.close()
        raise lane_error(refused, ask.prompt_param, ask.structured_param)
    return generation


async def _submit(state: GatewayState, plan: LanePlan) -> None:
    """Queue what the admission did not: every engine request of the plan, in its lane."""
    tier = plan.lane_requests[0].tier
    with tracing.span("lane.enqueue", kind=SpanKind.PRODUCER, attributes={"fairlane.tier": tier}):
        for lane_request in plan.lane_requests:
            await state.lanes.submit(lane_request)


def _relays(
    plan: LanePlan, firsts: list[LaneResult], streams: list[AsyncIterator[LaneResult | None]]
) -> list[Relay]:
    """One Relay per prompt, starting at its first result. When the worker refused one prompt,
    the others' first results are what they ran (charged); the refused one is done."""
    n = plan.sampling.n
    relays = []
    for i, (lane_request, first, stream) in enumerate(zip(plan.lane_requests, firsts, streams)):
        relay = Relay(
            request_id=lane_request.request_id,
            offset=i * n,
            first=first,
            results=stream,
            prompt_tokens=len(lane_request.prompt_token_ids),
        )
        if any(f.kind == "error" for f in firsts):
            relay.done = first.kind == "error"
            relay.ran = not relay.done
            if relay.ran:
                relay.choice_tokens[first.index] = first.num_output_tokens
        relays.append(relay)
    return relays


async def _settle_before_first_results(
    context: RequestContext, plan: LanePlan, exc: BaseException, got: dict[int, LaneResult]
) -> None:
    with anyio.CancelScope(shield=True):
        published = None
        if not isinstance(exc, SLOUnattainable):  # refused at the door: nothing was queued
            lanes = context.state.lanes
            for lane_request in plan.lane_requests:
                lanes.cancel_soon(lane_request.request_id)
            if not (isinstance(exc, Failed) and exc.status is Status.REDIS_LOST):
                published = await read_published(context, [r.request_id for r in plan.lane_requests])
        await settle(context, outcome_before_first_results(exc, got, published))


def slo_targets(auth: AuthContext, tier: str, settings: ApiSettings) -> tuple[float | None, float | None]:
    """The request's (TTFT, TPOT) targets in seconds: the tenant's own, else its tier's; None: none."""
    tier_ttft, tier_tpot = settings.slo_targets(tier)
    return auth.ttft_target_s or tier_ttft, auth.tpot_target_s or tier_tpot


async def _plan(state: GatewayState, auth: AuthContext, ask: GenerationRequest) -> LanePlan:
    """The lane requests of ``ask``, or the refusal that charges nothing: no worker, a prompt over
    the context, bad sampling options."""
    settings, model = state.settings, state.settings.model_name
    if not await state.lanes.has_worker(model):
        raise no_worker(model)
    max_model_len = await state.max_model_len()
    choices = ask.sampling_options.get("n", 1) * len(
        ask.prompts
    )  # a quota's max_tokens cap is on their total
    samplings: list[SamplingParams] = []
    for i, prompt_ids in enumerate(ask.prompts):
        max_tokens = resolve_max_tokens(
            ask.requested_max_tokens,
            prompt_tokens=len(prompt_ids),
            max_model_len=max_model_len,
            default=settings.max_tokens_default,
            cap=auth.max_tokens_cap and auth.max_tokens_cap // choices,
        )
        prefix = f"Prompt {i}: " if len(ask.prompts) > 1 else ""
        try:
            if max_model_len is not None:
                check_context(
                    len(prompt_ids), max_tokens, max_model_len=max_model_len, prompt_param=ask.prompt_param
                )
            same = samplings and samplings[-1].max_tokens == max_tokens
            samplings.append(
                samplings[-1] if same else SamplingParams(max_tokens=max_tokens, **ask.sampling_options)
            )
        except EngineError as exc:
            raise refused_by_engine_checks(exc, prefix=prefix) from exc
    ttft_target, tpot_target = slo_targets(auth, ask.tier, settings)
    lane_requests = [
        LaneRequest(
            request_id=rid,
            model=model,
            tier=ask.tier,
            tenant=str(auth.tenant_id),
            prompt_token_ids=tuple(prompt_ids),
            sampling=sampling,
            weight=auth.weight,
            ttft_target_s=ttft_target,
            tpot_target_s=tpot_target,
            traceparent=ask.traceparent,
            lora=ask.adapter,
        )
        for rid, prompt_ids, sampling in zip(
            relay_ids(ask.request_id, len(ask.prompts)), ask.prompts, samplings
        )
    ]
    return LanePlan(
        lane_requests=lane_requests,
        prompt_tokens=sum(len(p) for p in ask.prompts),
        reserved_tokens=sum(s.max_tokens * s.n for s in samplings),
        ttft_target_s=ttft_target,
        door_check=ttft_target is not None and settings.slo_gate and not settings.engine.slo_demote,
    )


def _annotate(context: RequestContext, plan: LanePlan, ask: GenerationRequest) -> str | None:
    """The request's attributes on its span; returns the span's trace context for the lane (the
    workers' spans join this trace), None while tracing is off."""
    if context.span is None:
        return None
    sampling = plan.sampling
    attributes = request_attributes(
        auth=context.auth,
        tier=context.tier,
        model=context.state.settings.model_name,
        max_tokens=sampling.max_tokens,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        prompt_param=ask.prompt_param,
    )
    context.span.set_attributes({k: v for k, v in attributes.items() if v is not None})
    context.span.set_attribute("gen_ai.usage.input_tokens", plan.prompt_tokens)
    return tracing.inject()


def _with_traceparent(plan: LanePlan, traceparent: str | None) -> LanePlan:
    if traceparent == plan.lane_requests[0].traceparent:
        return plan
    return replace(plan, lane_requests=[replace(r, traceparent=traceparent) for r in plan.lane_requests])


async def _admit(
    context: RequestContext,
    plan: LanePlan,
    lane_entry: tuple[str, dict[str, str]] | None,
    worker_settles: bool,
):
    """The quota admission (queueing ``lane_entry`` with it when the quota service can).

    A client that leaves while the admission is on its way does not cut it short: the script may
    have charged and queued already, so the call is finished (bounded by the quota client's
    timeout) and its admission set on ``context`` before the cancel goes on, for the caller to
    settle as cancelled (refunded, the lane entry cancelled, the request recorded)."""
    await context.state.lanes.settled()  # a request answered from an echo is settled in Redis first
    call = asyncio.ensure_future(
        context.quota.admit(
            auth=context.auth,
            request_id=context.request_id,
            tier=context.tier,
            prompt_tokens=plan.prompt_tokens,
            max_tokens=plan.reserved_tokens,
            lane_entry=lane_entry,
            worker_settles=worker_settles,
        )
    )
    try:
        return await asyncio.shield(call)
    except GatewayError:
        tracing.set_attributes({"fairlane.quota.decision": "refused"}, context.span)
        raise
    except asyncio.CancelledError:
        with anyio.CancelScope(shield=True):
            try:
                context.admission = await call
            except Exception:  # refused or failed: nothing was charged; an entry may be queued
                with contextlib.suppress(Exception):
                    await context.state.lanes.cancel(context.request_id)
        raise
    except BaseException:
        # Failed on the way: the limiter refunds what it may have charged; the request may be in
        # its lane already, so tell the workers to drop it.
        with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
            await context.state.lanes.cancel(context.request_id)
        raise


async def _door_check(context: RequestContext, plan: LanePlan) -> None:
    """The SLO door check (gateway/api/slo_gate.py): raises SLOUnattainable before anything is queued."""
    with tracing.span("slo_gate"):
        try:
            predicted = await context.state.slo_gate.check(
                tier=context.tier, prompt_tokens=plan.prompt_tokens, ttft_target_s=plan.ttft_target_s
            )
        except SLOUnattainable:
            tracing.set_attributes({"fairlane.slo.verdict": "refused"})
            tracing.set_attributes({"fairlane.slo.verdict": "refused"}, context.span)
            raise
        verdict = {
            "fairlane.slo.verdict": "admitted",
            "fairlane.slo.predicted_ttft_s": predicted,
            "fairlane.slo.ttft_target_s": plan.ttft_target_s,
        }
        tracing.set_attributes(verdict)
        tracing.set_attributes(verdict, context.span)
