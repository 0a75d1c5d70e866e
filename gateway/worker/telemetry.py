"""The worker's side of observability: the engine's plain-Python events and counters turned into
OpenTelemetry spans and Prometheus metrics (the engine imports neither).

Spans of one request on a worker, in the trace the lane message names (``traceparent``, the
gateway's request span):

    lane.wait        CONSUMER, from the gateway's enqueue to this worker taking the entry
    engine.request   from taking the entry to the end; events: admitted, resumed {mode},
                     preempted {mode: recompute | swap}, first_token, finished / aborted / slo_refused
      engine.prefill   admission to the first token; one event per prefill chunk {tokens, start}
      engine.decode    first token to the end

With speculative decoding on, engine.request ends with fairlane.spec.method, .draft_tokens,
.accepted_tokens (summed over the request's choices) and .acceptance_rate (when it drafted).

Metrics are updated from ``Engine.stats`` after every step: counters by the change since the last
step, gauges set, the step histograms observed once per step that ran the model.
"""

from __future__ import annotations

import time

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, StatusCode
from opentelemetry.util.types import AttributeValue

from engine import Engine, ErrorCode, RequestOutput
from gateway.lanes.keys import tier_priorities
from gateway.lanes.messages import LaneRequest
from gateway.telemetry import metrics, tracing
from gateway.telemetry.tracing import ns

ENGINE_SPAN_EVENTS = frozenset(
    {"admitted", "resumed", "preempted", "first_token", "finished", "aborted", "slo_refused"}
)


class RequestTrace:
    """The spans of one request on this worker (create only while tracing is on)."""

    def __init__(
        self,
        req: LaneRequest,
        *,
        worker_id: str,
        taken_at: float,
        resumed_tokens: int,
        speculative_method: str | None = None,
    ) -> None:
        tracer = tracing.tracer()
        parent = tracing.extract(req.traceparent)
        sampling = req.sampling
        common = {
            "fairlane.request_id": req.request_id,
            "fairlane.tier": req.tier,
            "fairlane.tenant.id": req.tenant,
            "fairlane.worker.id": worker_id,
            "gen_ai.request.model": req.model,
        }
        tracer.start_span(
            "lane.wait",
            context=parent,
            kind=SpanKind.CONSUMER,
            start_time=ns(req.enqueued_at),
            attributes={
                **common,
                "messaging.system": "redis",
                "messaging.destination.name": f"lanes:{req.model}:{req.tier}",
            },
        ).end(end_time=ns(taken_at))
        self.span: Span = tracer.start_span(
            "engine.request",
            context=parent,
            start_time=ns(taken_at),
            attributes={
                **common,
                "gen_ai.request.max_tokens": sampling.max_tokens,
                "gen_ai.request.temperature": sampling.temperature,
                "gen_ai.request.top_p": sampling.top_p,
                "gen_ai.usage.input_tokens": len(req.prompt_token_ids),
                "fairlane.resumed_tokens": resumed_tokens,
                "fairlane.lane.wait_s": max(0.0, taken_at - req.enqueued_at),
                **({"fairlane.slo.ttft_target_s": req.ttft_target_s} if req.ttft_target_s else {}),
            },
        )
        self._context = trace.set_span_in_context(self.span)
        self.phase: Span | None = None  # engine.prefill, then engine.decode
        self.preemptions = 0
        self.first_token_at: float | None = None
        self.speculative_method = speculative_method  # None: the engine does not speculate
        self.speculation: dict[int, tuple[int, int]] = {}  # choice -> (drafted, accepted) so far

    def _phase(self, name: str, at: float) -> None:
        if self.phase is not None:
            self.phase.end(end_time=ns(at))
        self.phase = tracing.tracer().start_span(name, context=self._context, start_time=ns(at))

    def output(self, out: RequestOutput) -> None:
        """One of the request's outputs: its events, and its choice's speculation so far."""
        self.events(out.events)
        self.speculation[out.index] = (out.num_draft_tokens, out.num_accepted_tokens)

    def events(self, events) -> None:
        """Add the engine's events (engine.request.SeqEvent) to the spans."""
        for event in events:
            at = ns(event.time)
            if event.name == "prefill_chunk":
                (self.phase or self.span).add_event("prefill_chunk", event.attrs, timestamp=at)
                continue
            if event.name == "admitted" or (event.name == "resumed" and self.phase is None):
                self._phase("engine.prefill", event.time)
            elif event.name == "first_token":
                self.first_token_at = event.time
                self._phase("engine.decode", event.time)
            elif event.name == "preempted":
                self.preemptions += 1
            if event.name in ENGINE_SPAN_EVENTS:
                self.span.add_event(event.name, event.attrs, timestamp=at)

    def refused(self, exc: Exception) -> None:
        """The engine refused the request on arrival (bad input, or its TTFT target)."""
        code = str(getattr(exc, "code", ErrorCode.ENGINE_ERROR))
        event = "slo_refused" if code == ErrorCode.SLO_UNATTAINABLE else "refused"
        self.span.add_event(event, {"code": code})
        self.span.set_status(StatusCode.ERROR, code)
        self.finish(None, status=code, num_output_tokens=0)

    def aborted(self) -> None:
        """The client went away (a cancel mark): the engine aborted the request."""
        self.span.add_event("aborted")
        self.finish(None, status="aborted", num_output_tokens=-1)

    def finish(self, out: RequestOutput | None, *, status: str, num_output_tokens: int) -> None:
        """End every span: ``out`` is the last output (None when aborted here)."""
        now = time.time()
        if self.phase is not None:
            self.phase.end(end_time=ns(now))
        attributes: dict[str, AttributeValue] = {
            "fairlane.preemptions": self.preemptions,
            "fairlane.status": status,
        }
        if num_output_tokens >= 0:
            attributes["gen_ai.usage.output_tokens"] = num_output_tokens
        if out is not None and out.finish_reason in ("stop", "length"):
            attributes["gen_ai.response.finish_reasons"] = [out.finish_reason]
        if self.first_token_at is not None:
            attributes["fairlane.engine.first_token_s"] = self.first_token_at - self.span.start_time / 1e9
        if self.speculative_method is not None:
            attributes.update(self._speculation())
        self.span.set_attributes(attributes)
        if out is not None and out.error is not None:
            self.span.set_status(StatusCode.ERROR, str(getattr(out.error, "code", ErrorCode.ENGINE_ERROR)))
        self.span.end(end_time=ns(now))

    def _speculation(self) -> dict[str, AttributeValue]:
        """fairlane.spec.*: the method, draft tokens verified and accepted over every choice, and
        the acceptance rate (only where something was drafted: a tier that does not speculate has 0)."""
        if self.speculation:
            drafted, accepted = (sum(column) for column in zip(*self.speculation.values()))
        else:
            drafted = accepted = 0
        attributes: dict[str, AttributeValue] = {
            "fairlane.spec.method": str(self.speculative_method),
            "fairlane.spec.draft_tokens": drafted,
            "fairlane.spec.accepted_tokens": accepted,
        }
        if drafted:
            attributes["fairlane.spec.acceptance_rate"] = accepted / drafted
        return attributes


class EngineMetrics:
    """Prometheus metrics of one worker's engine, refreshed after every step."""

    def __init__(self, engine: Engine, worker_id: str, tiers: list[str] | None = None) -> None:
        self.engine, self.worker_id, w = engine, worker_id, worker_id
        # the tier label of a priority (gateway/lanes/keys.py); a priority no tier has: its number
        self.tier_names = {p: t for t, p in tier_priorities(tiers or []).items()}
        self.spec_counters = {  # EngineStats field (by priority) -> its counter (by tier)
            "spec_draft_tokens_by_priority": metrics.SPEC_DRAFT_TOKENS,
            "spec_accepted_tokens_by_priority": metrics.SPEC_ACCEPTED_TOKENS,
            "spec_verifications_by_priority": metrics.SPEC_VERIFICATIONS,
        }
        self.spec_seen: dict[tuple[str, int], int] = {}
        self.running, self.waiting, self.swapped = (
            g.labels(w) for g in (metrics.RUNNING, metrics.WAITING, metrics.SWAPPED)
        )
        self.kv_used, self.kv_free, self.kv_util = (
            g.labels(w) for g in (metrics.KV_USED, metrics.KV_FREE, metrics.KV_UTIL)
        )
        self.counters = {  # EngineStats field -> its counter
            "prefix_hit_tokens": metrics.PREFIX_HITS.labels(w),
            "prefill_tokens": metrics.COMPUTED.labels(w, "prefill"),
            "decode_tokens": metrics.COMPUTED.labels(w, "decode"),
            "swaps": metrics.PREEMPTIONS.labels(w, "swap"),
            "recompute_preemptions": metrics.PREEMPTIONS.labels(w, "recompute"),
            "admissions": metrics.ADMISSIONS.labels(w),
            "slo_refusals": metrics.SLO_REFUSALS.labels(w),
            "lora_slot_loads": metrics.LORA_SLOT_LOADS.labels(w),
            "lora_slot_evictions": metrics.LORA_SLOT_EVICTIONS.labels(w),
            "experts_touched": metrics.EXPERTS_TOUCHED.labels(w),
            "weight_bytes_read": metrics.WEIGHT_BYTES.labels(w),
        }
        self.seen = {name: 0 for name in self.counters}
        self.batch, self.tokens, self.seconds = (
            h.labels(w) for h in (metrics.BATCH_SIZE, metrics.STEP_TOKENS, metrics.STEP_SECONDS)
        )
        self.steps = 0
        self.update()

    def update(self) -> None:
        engine, stats = self.engine, self.engine.stats
        for name, counter in self.counters.items():
            value = getattr(stats, name)
            if value > self.seen[name]:
                counter.inc(value - self.seen[name])
                self.seen[name] = value
        for name, family in self.spec_counters.items():
            for priority, value in getattr(stats, name).items():
                seen = self.spec_seen.get((name, priority), 0)
                if value > seen:
                    tier = self.tier_names.get(priority, str(priority))
                    family.labels(self.worker_id, tier).inc(value - seen)
                    self.spec_seen[(name, priority)] = value
        if stats.steps > self.steps:
            self.steps = stats.steps
            self.batch.observe(stats.last_step_seqs)
            self.tokens.observe(stats.last_step_tokens)
            self.seconds.observe(stats.last_step_seconds)
        self.running.set(engine.num_running)
        self.waiting.set(engine.num_waiting)
        self.swapped.set(engine.num_swapped)
        total, free = engine.num_total_blocks, engine.num_free_blocks
        self.kv_used.set(total - free)
        self.kv_free.set(free)
        self.kv_util.set((total - free) / total if total else 0.0)
