"""Tracing's switch: off by default at no cost (no provider, exporter or middleware; a null span), on from
FAIRLANE_OTEL_ENDPOINT or the standard OTEL_EXPORTER_OTLP_ENDPOINT, over HTTP or gRPC; and the
JSON log format."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from gateway.settings import WorkerSettings
from gateway.telemetry import tracing
from gateway.telemetry.logs import JsonFormatter

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def run(code: str, **env) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "FAIRLANE_OTEL"))}
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        env={**clean, "PYTHONPATH": REPO, "FAIRLANE_CONFIG": "", **env},
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


PROBE = (
    "import sys\n"
    "from gateway.api.app import create_app\n"
    "from gateway.settings import ApiSettings\n"
    "from gateway.telemetry import tracing\n"
    "app = create_app(ApiSettings(dev=True, redis_url='redis://127.0.0.1:1'))\n"
    "names = [m.cls.__name__ for m in app.user_middleware]\n"
    "from opentelemetry import trace\n"
    "exporters = any(m.startswith('opentelemetry.exporter') for m in sys.modules)\n"
    "print(tracing.enabled(), exporters, type(trace.get_tracer_provider()).__name__,"
    " 'TracingMiddleware' in names, type(tracing.span('x')).__name__)"
)


def test_off_by_default_costs_nothing():
    # (redis-py imports the SDK module for its own optional instrumentation: not a provider.)
    assert run(PROBE) == "False False ProxyTracerProvider False nullcontext"


@pytest.mark.parametrize(
    "env",
    [
        {"FAIRLANE_OTEL_ENDPOINT": "http://127.0.0.1:4318"},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"},
    ],
)
def test_an_endpoint_turns_it_on(env):
    assert run(PROBE, **env) == "True True TracerProvider True _AgnosticContextManager"


@pytest.mark.parametrize("protocol, exporter", [("http/protobuf", "http"), ("grpc", "grpc")])
def test_the_protocol_picks_the_otlp_exporter(protocol, exporter):
    settings = WorkerSettings(otel_endpoint="http://127.0.0.1:4317", otel_protocol=protocol)
    made = tracing._exporter(tracing.endpoint_of(settings), tracing.protocol_of(settings))
    try:
        assert f".{exporter}." in type(made).__module__
        if exporter == "http":
            assert made._endpoint == "http://127.0.0.1:4317/v1/traces"
    finally:
        made.shutdown()


def test_traceparent_round_trip_and_garbage():
    assert tracing.extract(None) is None and tracing.extract("not-a-traceparent") is None
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert tracing.inject(tracing.extract(parent)) == parent


def test_json_log_lines_carry_extra_fields():
    record = logging.LogRecord(
        "fairlane.request", logging.INFO, __file__, 1, "request %s", ("finished",), None
    )
    record.request_id, record.ttft_ms = "abc", 12.5
    line = json.loads(JsonFormatter("gateway").format(record))
    assert line["msg"] == "request finished" and line["request_id"] == "abc" and line["ttft_ms"] == 12.5
    assert line["level"] == "INFO" and line["process"] == "gateway" and line["logger"] == "fairlane.request"
