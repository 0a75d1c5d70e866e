"""OpenTelemetry tracing for fairlane's processes: one trace per request, from the gateway's HTTP
span through the lane into the engine's steps (docs/observability.md).

Off by default, at no cost: unless an OTLP endpoint (``otel_endpoint``, else the standard
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT``) or ``otel_console`` is
set, no exporter is imported, no provider or processor exists and ``span()`` is a shared
null context manager. On, spans go through a BatchSpanProcessor (its own thread; queue and delay
from the standard ``OTEL_BSP_*`` variables) to the OTLP exporter of ``otel_protocol``:
``http/protobuf`` (default, port 4318) or ``grpc`` (port 4317).

The W3C trace context crosses the lane as the ``traceparent`` of the LaneRequest; a client's
incoming ``traceparent`` header is the parent of the gateway's span.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any
from urllib.parse import urlparse

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

TRACER_NAME = "fairlane"
HTTP_TRACES_PATH = "/v1/traces"
EXPORT_BATCH_SIZE, EXPORT_DELAY_MS = 64, 100  # spans per OTLP export, and the longest wait before one
_PROPAGATOR = TraceContextTextMapPropagator()
_NULL = contextlib.nullcontext()
_provider = None  # the SDK TracerProvider once tracing is on (None: off)
_tracer: trace.Tracer | None = None


def endpoint_of(settings) -> str | None:
    """The OTLP endpoint tracing exports to, or None (off)."""
    return (
        settings.otel_endpoint
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or None
    )


def protocol_of(settings) -> str:
    protocol = (
        settings.otel_protocol
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    )
    if protocol not in ("http/protobuf", "grpc"):
        raise ValueError(f"unsupported OTLP protocol {protocol!r}: use http/protobuf or grpc")
    return protocol


def _exporter(endpoint: str, protocol: str):
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        parsed = urlparse(endpoint if "://" in endpoint else f"http://{endpoint}")
        return GrpcExporter(endpoint=parsed.netloc, insecure=parsed.scheme != "https")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    # Like OTEL_EXPORTER_OTLP_ENDPOINT, a base URL: the signal's path is appended.
    url = endpoint.rstrip("/")
    return HttpExporter(endpoint=url if url.endswith(HTTP_TRACES_PATH) else url + HTTP_TRACES_PATH)


def setup_tracing(settings, service_name: str) -> bool:
    """Install the SDK tracer provider for this process if tracing is on; True when it is."""
    endpoint = endpoint_of(settings)
    if not endpoint and not settings.otel_console:
        return False
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    # OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES, when set, win (Resource.create reads them).
    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": service_name}
    provider = TracerProvider(
        resource=Resource.create(attributes),
        sampler=ParentBased(TraceIdRatioBased(settings.otel_sample_ratio)),
    )
    if endpoint:
        # Small batches, sent often: encoding a batch holds the GIL, and the SDK's default of up to
        # 512 spans per export stalled the gateway's event loop for tens of ms at a time (p99 of the
        # request path +75 ms at 200 requests/s, against +3.5 ms with 64; benchmarks.gateway_overhead
        # --trace). OTEL_BSP_MAX_EXPORT_BATCH_SIZE / OTEL_BSP_SCHEDULE_DELAY, when set, win.
        batching = {}
        if "OTEL_BSP_MAX_EXPORT_BATCH_SIZE" not in os.environ:
            batching["max_export_batch_size"] = EXPORT_BATCH_SIZE
        if "OTEL_BSP_SCHEDULE_DELAY" not in os.environ:
            batching["schedule_delay_millis"] = EXPORT_DELAY_MS
        provider.add_span_processor(
            BatchSpanProcessor(_exporter(endpoint, protocol_of(settings)), **batching)
        )
    if settings.otel_console:
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    use_provider(provider)
    trace.set_tracer_provider(provider)
    return True


def use_provider(provider) -> None:
    """Trace with ``provider`` (an SDK TracerProvider) in this process; None turns tracing off."""
    global _provider, _tracer
    _provider = provider
    _tracer = provider.get_tracer(TRACER_NAME) if provider is not None else None


def shutdown_tracing() -> None:
    """Export what is queued and stop (at process exit)."""
    if _provider is not None:
        _provider.shutdown()
    use_provider(None)


def enabled() -> bool:
    return _tracer is not None


def tracer() -> trace.Tracer:
    """This process's tracer (a no-op one while tracing is off)."""
    return _tracer if _tracer is not None else trace.NoOpTracer()


def span(name: str, **kwargs: Any):
    """A child span of the current one as a context manager; a null one while tracing is off."""
    if _tracer is None:
        return _NULL
    return _tracer.start_as_current_span(name, **kwargs)


def set_attributes(attributes: dict[str, Any], target: trace.Span | None = None) -> None:
    """Set attributes (None values skipped) on ``target`` or the current span; nothing when off."""
    if _tracer is None:
        return
    target = target or trace.get_current_span()
    if target.is_recording():
        target.set_attributes({k: v for k, v in attributes.items() if v is not None})


def extract(traceparent: str | None, tracestate: str | None = None) -> Context | None:
    """The context a W3C ``traceparent`` (and ``tracestate``) names; None without a valid one."""
    if not traceparent:
        return None
    carrier = {"traceparent": traceparent}
    if tracestate:
        carrier["tracestate"] = tracestate
    context = _PROPAGATOR.extract(carrier)
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def inject(context: Context | None = None) -> str | None:
    """The ``traceparent`` of the current span (or of ``context``); None if there is none."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context)
    return carrier.get("traceparent")


def trace_id_of(target: trace.Span | None = None) -> str | None:
    """The 32-hex trace id of ``target`` or the current span (for logs); None outside a trace."""
    context = (target or trace.get_current_span()).get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None


def ns(unix_s: float) -> int:
    """Unix seconds → the nanoseconds OpenTelemetry timestamps are in."""
    return int(unix_s * 1e9)
