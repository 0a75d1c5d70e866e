"""The client side of `benchmarks.scheduling --http`: `fairlane serve` as a user starts it, tenants
and keys made over the admin REST API, a trace replayed on the wall clock as streamed completions
through the official `openai` client (each tenant from a client process of its own:
benchmarks/sched_http_client.py), and what the server tells about each request afterwards.

One replayed request is a `SimRequest` of engine.sim, so the in-process scenarios' measures
(`SimReport.ttft_p`, `throughput`, `met_slo`) read HTTP runs unchanged; times are seconds from the
run's start, `first_token` and `finish` when the client received them.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx

from benchmarks.round_trip import Served, serve
from benchmarks.sched_http_client import (
    START_AHEAD_S,
    TIERS,
    Call,
    Sent,
    replay_calls,
    replay_in_processes,
)
from benchmarks.sched_prompts import word_ids
from benchmarks.sched_service import prompt_events, series
from engine.assets import load_tokenizer
from engine.config import EngineConfig
from engine.sim import SimReport, SimRequest

DRAIN_TIMEOUT_S = 60.0
WARM_UP_STREAMS = 32  # the engine's max_num_seqs in these runs

__all__ = ["TIERS", "Sent", "Server", "replay"]


@dataclass
class Server:
    """One `fairlane serve` with the engine settings and policy of its runs."""

    served: Served
    admin_token: str
    model: str
    words: list[int]  # the prompts' token ids (benchmarks.sched_prompts)
    tenants: int = 0
    # The seed of the next request's prompt: every request a server sees has a prompt of its own.
    # Two prompts of one seed share their first tokens, and a server keeps the blocks of what it
    # served (prefix caching): a run whose prompts repeated those of the warm-up or of an earlier
    # run found most of them cached, and its prefills were twice as fast as they are.
    seeds: int = 0
    # One client for the admin API and the scrapes of /metrics: a fresh one per call builds an SSL
    # context (tens of ms of CPU each, several calls a run, on the cores the server uses).
    http: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=30))

    @classmethod
    def start(
        cls,
        model: str,
        policy: str,
        engine: dict,
        workdir: Path,
        trace_spans: bool,
        warm_up_rounds: int = 2,
        warm_up_streams: int = WARM_UP_STREAMS,
    ) -> Server:
        workdir.mkdir(parents=True, exist_ok=True)
        token = "fl-admin-" + secrets.token_urlsafe(24)
        env = {f"FAIRLANE_ENGINE__{k.upper()}": str(v) for k, v in engine.items() if k != "model"}
        env |= {"FAIRLANE_ENGINE__POLICY": policy, "FAIRLANE_ADMIN_TOKEN": token}
        if trace_spans:  # every span printed to the server's log, read back by sched_http_timeline
            env["FAIRLANE_OTEL_CONSOLE"] = "true"
        served = serve(model, workdir, env=env)
        name = httpx.get(
            served.base_url + "/v1/models", headers={"Authorization": f"Bearer {served.api_key}"}
        ).json()["data"][0]["id"]
        server = cls(served, token, name, prompt_words(model))
        server.warm_up(warm_up_rounds, warm_up_streams)
        return server

    def warm_up(self, rounds: int = 2, streams: int = WARM_UP_STREAMS) -> None:
        """Bursts of `streams` (WARM_UP_STREAMS) streamed requests first, so what a server does once
        (the first forwards at each batch size, connections and pools of the gateway and the client)
        is not in a measured run (the in-process runs need one request)."""
        calls = [Call(0.0, 64, 4, 0, seed) for seed in range(self.seeds, self.seeds + streams)]
        self.seeds += streams
        for _ in range(rounds):
            asyncio.run(
                replay_calls(
                    self.served.base_url,
                    self.model,
                    self.served.api_key,
                    calls,
                    None,
                    time.time(),
                    self.words,
                )
            )

    def admin(self, method: str, path: str, body: dict) -> dict:
        response = self.http.request(
            method,
            self.served.base_url + "/admin" + path,
            json=body,
            headers={"Authorization": f"Bearer {self.admin_token}"},
        )
        if response.status_code >= 300:
            raise RuntimeError(f"{method} /admin{path}: HTTP {response.status_code} {response.text}")
        return response.json()

    def tenant(self, name: str, weight: float, ttft: float | None, tpot: float | None) -> str:
        """A fresh tenant (a name unique on this server: fair-share counters start clean) allowed
        every tier, with its targets; the secret of a new key of it."""
        self.tenants += 1
        created = self.admin(
            "POST",
            "/tenants",
            {
                "name": f"{name}-{self.tenants}",
                "weight": weight,
                "default_tier": "standard",
                "allowed_tiers": ["priority", "standard", "batch"],
                "ttft_target_s": ttft,
                "tpot_target_s": tpot,
            },
        )
        return self.admin("POST", f"/tenants/{created['id']}/keys", {"name": "bench"})["key"]

    def metrics(self) -> dict[str, float]:
        """The server's Prometheus samples (name{labels} -> value), lane gauges and histograms."""
        text = self.http.get(self.served.base_url + "/metrics").text
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                try:
                    out[name] = out.get(name, 0.0) + float(value)  # series of several workers add up
                except ValueError:
                    pass
        return out

    def drain(self) -> None:
        """Wait until no lane holds or runs a request (cancelled streams are aborted by then)."""
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while time.monotonic() < deadline:
            samples = self.metrics()
            busy = sum(
                v
                for k, v in samples.items()
                if k.startswith(("fairlane_lane_depth", "fairlane_lane_pending", "fairlane_engine_running"))
            )
            if busy == 0:
                return
            time.sleep(0.2)
        raise TimeoutError(f"the server still had work {DRAIN_TIMEOUT_S} s after the run")


_WORDS: dict[str, list[int]] = {}
_WORDS_LOCK = threading.Lock()


def prompt_words(model: str) -> list[int]:
    """The prompts' token ids of `model` (benchmarks.sched_prompts), worked out once for the servers
    that start side by side (a tokenizer load and a decode of its vocabulary: seconds of CPU)."""
    with _WORDS_LOCK:
        if model not in _WORDS:
            _WORDS[model] = word_ids(load_tokenizer(model))
        return _WORDS[model]


def tier_means(before: dict[str, float], after: dict[str, float], metric: str) -> dict[str, float]:
    """Mean of a per-tier histogram over the run (seconds), from two scrapes."""
    out = {}
    for tier in TIERS.values():
        key = f'{{tier="{tier}"}}'
        n = after.get(f"{metric}_count{key}", 0.0) - before.get(f"{metric}_count{key}", 0.0)
        total = after.get(f"{metric}_sum{key}", 0.0) - before.get(f"{metric}_sum{key}", 0.0)
        if n > 0:
            out[tier] = total / n
    return out


def replay(
    server: Server, trace: list[SimRequest], until: float | None = None, start_ahead_s: float = START_AHEAD_S
) -> tuple[SimReport, list]:
    """Serve `trace` through `server` (one new tenant and key per trace tenant, with its weight and
    targets; arrivals on the wall clock, the first ``start_ahead_s`` after the client processes are
    told t0); the report, and what the client saw of each request."""
    trace = sorted((replace(r) for r in trace), key=lambda r: r.arrival)
    first: dict[str, SimRequest] = {}
    for r in trace:
        first.setdefault(r.tenant, r)
    keys = {t: server.tenant(t, r.weight, r.ttft_target_s, r.tpot_target_s) for t, r in first.items()}
    calls: dict[str, tuple[str, list[Call]]] = {t: (key, []) for t, key in keys.items()}
    for i, r in enumerate(trace, start=server.seeds):
        calls[r.tenant][1].append(Call(r.arrival, r.prompt_len, r.output_len, r.priority, i))
    server.seeds += len(trace)
    before = server.metrics()
    by_tenant, t0 = replay_in_processes(
        server.served.base_url, server.model, calls, until, server.words, start_ahead_s
    )
    seen = {t: iter(s) for t, s in by_tenant.items()}
    sent = [next(seen[r.tenant]) for r in trace]  # each tenant's calls in the trace's order
    duration = time.time() - t0
    server.drain()
    after = server.metrics()
    for i, (r, s) in enumerate(zip(trace, sent)):
        r.request_id = s.request_id or f"unsent-{i}"
        if s.chunk_times:
            r.first_token = s.chunk_times[0] - t0
            if s.tokens >= r.output_len:
                r.finish = s.chunk_times[-1] - t0
        elif s.error:
            r.refused = True
    report = SimReport(trace, duration, 0, int(after_minus(before, after, "fairlane_engine_preemptions")))
    report.metrics = {  # type: ignore[attr-defined]
        "lane_queue_mean_s": tier_means(before, after, "fairlane_lane_queue_seconds"),
        "server_ttft_mean_s": tier_means(before, after, "fairlane_ttft_seconds"),
        "errors": dict(Counter(s.error for s in sent if s.error)),  # "503 slo_unattainable": count
        # the gateway's event loop over the run: wakes later than 10 / 50 / 100 ms, GC pauses over 10 ms
        "loop_lag": histogram_over(before, after, "fairlane_event_loop_lag_seconds", (0.01, 0.05, 0.1)),
        "gc_pauses": histogram_over(before, after, "fairlane_gc_pause_seconds", (0.01,)),
    }
    report.sent = sent  # type: ignore[attr-defined]
    report.t0 = t0  # type: ignore[attr-defined]
    return report, sent


def histogram_over(before: dict[str, float], after: dict[str, float], metric: str, bounds) -> dict:
    """Observations of a histogram over the run (every label set summed), and how many of them
    exceeded each of ``bounds`` (seconds: bucket edges of the metric), from two scrapes."""

    def grown(name: str, le: str | None = None) -> float:
        total = 0.0
        for k, v in after.items():
            if k.startswith(name + "{") or k == name:
                if le is None or f'le="{le}"' in k:
                    total += v - before.get(k, 0.0)
        return total

    count = grown(metric + "_count")
    out = {"count": count}
    for bound in bounds:
        out[f"over_{1000 * bound:g}ms"] = count - grown(metric + "_bucket", repr(float(bound)))
    return out


def after_minus(before: dict[str, float], after: dict[str, float], prefix: str) -> float:
    """Growth of every series of a counter over the run."""
    return sum(v - before.get(k, 0.0) for k, v in after.items() if k.startswith(prefix + "_total"))


def service(
    trace: list[SimRequest], sent: list[Sent], t0: float, marks: dict[str, dict] | None = None
) -> tuple[list[float], dict]:
    """Weighted service each tenant received (benchmarks/sched_service.py): output tokens as their
    chunks reached the client (a chunk's tokens: the request's output tokens, its usage, spread
    evenly over its chunks), prompt tokens as the engine's prefill chunks computed them (from the
    spans in ``marks``), or whole at the client's first token for a request without them (no
    ``marks``: --no-spans, or ``service_at_first_token``)."""
    config = EngineConfig()
    w_in, w_out = config.vtc_input_weight, config.vtc_output_weight
    events = []
    for r, s in zip(trace, sent):
        if not s.chunk_times:
            continue
        per_chunk = w_out * s.tokens / len(s.chunk_times) / r.weight
        events += [(t - t0, r.tenant, per_chunk) for t in s.chunk_times]
        chunks = [(t - t0, n, at) for t, n, at in (marks or {}).get(s.request_id, {}).get("chunks", [])]
        if chunks:
            events += prompt_events(r.tenant, r.weight, r.prompt_len, chunks, w_in)
        else:
            events.append((s.chunk_times[0] - t0, r.tenant, w_in * r.prompt_len / r.weight))
    return series(events, {r.tenant for r in trace})
