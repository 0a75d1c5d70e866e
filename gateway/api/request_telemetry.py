"""What the gateway reports when a request ends, in one place: the request metrics, the attributes
of its trace span (OpenTelemetry GenAI conventions where they exist, ``fairlane.*`` for ours) and
one JSON log line. Never the prompt, the completion or a key.
"""

from __future__ import annotations

import logging
import time

from opentelemetry.trace import Span, StatusCode

from gateway.api.auth import AuthContext
from gateway.api.errors import GatewayError
from gateway.telemetry import metrics, tracing

log = logging.getLogger("fairlane.request")
OPERATIONS = {"messages": "chat", "prompt": "text_completion"}  # gen_ai.operation.name by the prompt's field


def status_of(exc: GatewayError) -> str:
    """The status label of a request that ended with ``exc``: its error code (a bounded set)."""
    return exc.code or exc.error_type


def request_attributes(
    *,
    auth: AuthContext,
    tier: str,
    model: str,
    max_tokens: int | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    prompt_param: str = "messages",
) -> dict:
    """Attributes known when the request is admitted (the gateway span's)."""
    return {
        "gen_ai.operation.name": OPERATIONS.get(prompt_param),
        "gen_ai.request.model": model,
        "gen_ai.request.max_tokens": max_tokens,
        "gen_ai.request.temperature": temperature,
        "gen_ai.request.top_p": top_p,
        "fairlane.tenant.id": str(auth.tenant_id),
        "fairlane.tier": tier,
    }


def finish_request(
    *,
    span: Span | None,
    tenant_label: bool,
    request_id: str,
    auth: AuthContext,
    tier: str,
    model: str,
    status: str,
    prompt_tokens: int,
    completion_tokens: int,
    started: float,
    ended: float | None = None,
    first_token_at: float | None = None,
    ran: bool = False,
) -> None:
    """Count, annotate and log a request that ended with ``status`` (a finish reason, cancelled,
    or an error code). ``ran``: it reached a worker (its duration is observed). Token counts are
    the usage record's (0 prompt tokens for a request that never ran). ``ended``: when it ended
    (monotonic; default: now), for a report written after the response."""
    latency = (time.monotonic() if ended is None else ended) - started
    ttft = first_token_at - started if first_token_at is not None else None
    tenant = str(auth.tenant_id) if tenant_label else ""
    metrics.REQUESTS.labels(tier, status, tenant).inc()
    if prompt_tokens:
        metrics.PROMPT_TOKENS.labels(tier, tenant).inc(prompt_tokens)
    if completion_tokens:
        metrics.OUTPUT_TOKENS.labels(tier, tenant).inc(completion_tokens)
    if ttft is not None:
        metrics.TTFT.labels(tier).observe(ttft)
    if ran:
        metrics.E2E.labels(tier).observe(latency)
    trace_id = None
    if span is not None and span.is_recording():
        trace_id = tracing.trace_id_of(span)
        finished = status in ("stop", "length")
        span.set_attributes(
            {
                k: v
                for k, v in {
                    "gen_ai.response.id": request_id,
                    "gen_ai.usage.input_tokens": prompt_tokens,
                    "gen_ai.usage.output_tokens": completion_tokens,
                    "gen_ai.response.finish_reasons": [status] if finished else None,
                    "fairlane.status": status,
                    "fairlane.ttft_s": ttft,
                    "fairlane.latency_s": latency,
                }.items()
                if v is not None
            }
        )
        if not finished and status != "cancelled":
            span.set_status(StatusCode.ERROR, status)
    log.info(
        "request finished",
        extra={
            "request_id": request_id,
            "trace_id": trace_id,
            "tenant_id": auth.tenant_id,
            "key_id": auth.key_id,
            "tier": tier,
            "model": model,
            "status": status,
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "ttft_ms": round(ttft * 1000, 3) if ttft is not None else None,
            "latency_ms": round(latency * 1000, 3),
        },
    )
