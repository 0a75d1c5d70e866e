"""A real OTLP/HTTP trace receiver for tests: decodes the ExportTraceServiceRequest protobufs the
OpenTelemetry exporters POST to /v1/traces and keeps every span as a plain dict."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}


def _value(any_value):
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in any_value.kvlist_value.values}
    return getattr(any_value, kind) if kind else None


def _attrs(key_values) -> dict:
    return {kv.key: _value(kv.value) for kv in key_values}


class OTLPReceiver:
    """``with OTLPReceiver() as rx:`` listens on 127.0.0.1:rx.port; ``rx.spans`` fills as exports arrive."""

    def __init__(self) -> None:
        self.spans: list[dict] = []
        self.requests = 0
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (the http.server name)
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.path != "/v1/traces" or self.headers.get("content-type") != "application/x-protobuf":
                    self.send_response(404)
                    self.end_headers()
                    return
                receiver._add(ExportTraceServiceRequest.FromString(body))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def _add(self, request: ExportTraceServiceRequest) -> None:
        spans = []
        for resource_spans in request.resource_spans:
            service = _attrs(resource_spans.resource.attributes).get("service.name")
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans.append(
                        {
                            "service": service,
                            "name": span.name,
                            "kind": KINDS[span.kind],
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent_span_id": span.parent_span_id.hex() or None,
                            "start_ns": span.start_time_unix_nano,
                            "end_ns": span.end_time_unix_nano,
                            "attributes": _attrs(span.attributes),
                            "status": span.status.code,
                            "events": [
                                {
                                    "name": e.name,
                                    "time_ns": e.time_unix_nano,
                                    "attributes": _attrs(e.attributes),
                                }
                                for e in span.events
                            ],
                        }
                    )
        with self.lock:
            self.requests += 1
            self.spans.extend(spans)

    def wait_for(self, predicate, timeout_s: float = 30.0) -> list[dict]:
        """Wait until ``predicate(spans)`` holds; returns the spans (raises TimeoutError)."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self.lock:
                spans = list(self.spans)
            if predicate(spans):
                return spans
            if time.monotonic() > deadline:
                raise TimeoutError(f"spans never matched; got {sorted({s['name'] for s in spans})}")
            time.sleep(0.1)

    def __enter__(self) -> OTLPReceiver:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
