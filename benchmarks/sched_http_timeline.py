"""Where a request's first token waited over HTTP (benchmarks.scheduling --http), from the client's
clock and the spans `fairlane serve` printed to its log (`otel_console`: one trace per request).

From its arrival (when the client sends it) to its first token at the client, a request's time goes
to (seconds, summing to the client's TTFT):
- `to_gateway`: until the gateway's server span starts (the client's loop, connection, HTTP parsing);
- `gateway`: auth, tokenization, quotas and the SLO gate, until the request is in its lane;
- `lane`: in the lane until a worker took it (the worker's pull and prefetch: `lane.wait`);
- `engine_queue`: in the engine's waiting queue until admitted;
- `prefill`: admitted to the engine's first token (its prefill chunks, steps shared with others);
- `relay`: the engine's first token to the gateway sending it (the worker's write, the relay's read);
- `to_client`: the gateway's SSE chunk to the client parsing it.
Beside them, `client_lag`: the longest the client process's own event loop woke late while the
request waited for its first token (a client stall, not the server's).
Parts whose span is missing fold into the next part that can be measured.
"""

from __future__ import annotations

import json
from datetime import datetime

PARTS = ("to_gateway", "gateway", "lane", "engine_queue", "prefill", "relay", "to_client")


def _t(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def _objects(text: str):
    """The JSON objects in a log of one-line records and indented spans, in order."""
    decoder, i = json.JSONDecoder(), 0
    while (i := text.find("{", i)) >= 0:
        if i > 0 and text[i - 1] != "\n":  # objects open at the start of a line
            i += 1
            continue
        try:
            obj, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            i += 1
            continue
        yield obj


def marks(log: bytes) -> dict[str, dict]:
    """request id -> its marks, from a server log's bytes (wall-clock seconds): `start` (server
    span), `enqueued`/`taken` (lane.wait), `admitted`/`first_token` (engine events), `relayed` (the
    gateway's first token, from its log line, with `gateway_ttft`: its own TTFT, from taking the
    request), `preemptions` and `chunks` (each prefill chunk: its end, tokens, first position)."""
    by_trace: dict[str, dict] = {}
    out: dict[str, dict] = {}
    for obj in _objects(log.decode(errors="replace")):
        if obj.get("msg") == "request finished" and obj.get("request_id"):
            if obj.get("ttft_ms") is not None and obj.get("latency_ms") is not None:
                # the line is written as the request ends: its start is `latency_ms` before (the
                # line's time has milliseconds), its first token `ttft_ms` after that
                m = out.setdefault(obj["request_id"], {})
                m["gateway_ttft"] = obj["ttft_ms"] / 1000
                m["relayed"] = _t(obj["ts"]) - (obj["latency_ms"] - obj["ttft_ms"]) / 1000
            continue
        context, name = obj.get("context"), obj.get("name")
        if not isinstance(context, dict) or not name or "start_time" not in obj:
            continue
        m = by_trace.setdefault(context["trace_id"], {})
        attrs = obj.get("attributes") or {}
        if "fairlane.request_id" in attrs:
            m["request_id"] = attrs["fairlane.request_id"]
        if obj.get("parent_id") is None:
            m["start"] = _t(obj["start_time"])
        elif name == "lane.wait":
            m["enqueued"], m["taken"] = _t(obj["start_time"]), _t(obj["end_time"])
        elif name == "engine.prefill":  # (again after a preemption by recompute)
            chunks = m.setdefault("chunks", [])
            for event in obj.get("events") or []:
                if event["name"] == "prefill_chunk":
                    a = event.get("attributes") or {}
                    chunks.append((_t(event["timestamp"]), a.get("tokens", 0), a.get("start", 0)))
        elif name == "engine.request":
            m["preemptions"] = attrs.get("fairlane.preemptions", 0)
            for event in obj.get("events") or []:
                if event["name"] in ("admitted", "first_token"):
                    m.setdefault(event["name"], _t(event["timestamp"]))
                if event["name"] == "admitted" and "nested" not in m:  # started inside a step in flight
                    m["nested"] = any("interrupting" in k for k in event.get("attributes") or {})
    for m in by_trace.values():
        if "request_id" in m:
            out.setdefault(m["request_id"], {}).update(m)
    return out


def waits(arrival: float, first_token: float, m: dict) -> dict:
    """A request's client TTFT (arrival and first token: wall-clock seconds) split into PARTS."""
    order = ("start", "enqueued", "taken", "admitted", "first_token", "relayed")
    out = dict.fromkeys(PARTS, 0.0)
    last = arrival
    for name, part in zip(order, PARTS):  # each mark ends its part
        if name in m and last <= m[name] <= first_token:
            out[part] = m[name] - last
            last = m[name]
    out["to_client"] = first_token - last
    out["preemptions"] = m.get("preemptions", 0)
    return out


def summary(report, marks_by_id: dict[str, dict], requests) -> dict:
    """Mean of each part over `requests` (of an HTTP run's report) that got a first token, the
    split of the slowest, and the client's TTFT against the gateway's own."""
    rows = []
    sent = {x.request_id: x for x in getattr(report, "sent", []) if x.request_id}
    for r in requests:
        if r.first_token is None:
            continue
        m = marks_by_id.get(r.request_id, {})
        w = waits(report.t0 + r.arrival, report.t0 + r.first_token, m)
        w["client_lag"] = sent[r.request_id].client_lag if r.request_id in sent else 0.0
        w["client_ttft"], w["gateway_ttft"] = r.ttft, m.get("gateway_ttft", float("nan"))
        w["traced"] = "taken" in m
        w["nested"] = bool(m.get("nested"))
        rows.append(w)
    if not rows:
        return {}
    keys = PARTS + ("preemptions", "client_ttft", "gateway_ttft", "client_lag")
    mean = {k: sum(w[k] for w in rows) / len(rows) for k in keys}
    worst = max(rows, key=lambda w: w["client_ttft"])
    return {
        "requests": len(rows),
        "traced": sum(w["traced"] for w in rows),
        "nested": sum(w["nested"] for w in rows),  # started inside a step in flight
        "mean": mean,
        "slowest": {"ttft": worst["client_ttft"], **worst},
    }


def line(name: str, s: dict) -> str:
    """One markdown row: client vs gateway TTFT, the mean split (ms) and the slowest request's."""
    if not s:
        return f"| {name} | no request got a token | | |"
    fmt = lambda w: ", ".join(f"{k} {1000 * w[k]:.0f}" for k in PARTS if w[k] >= 0.0005)  # noqa: E731
    mean = s["mean"]
    return (
        f"| {name} | {1000 * mean['client_ttft']:.0f} / {1000 * mean['gateway_ttft']:.0f} | {fmt(mean)} "
        f"({s.get('nested', 0)} of {s['requests']} started inside a step in flight) | "
        f"{1000 * s['slowest']['ttft']:.0f}: {fmt(s['slowest'])} ({s['slowest']['preemptions']} preempted; "
        f"its client's loop {1000 * s['slowest'].get('client_lag', 0.0):.0f} ms late) |"
    )
