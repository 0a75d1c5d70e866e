"""`python -m benchmarks.scheduling --http`: the scheduling scenarios as users meet them, through
`fairlane serve` over HTTP.

Two servers run side by side, each as a user starts it (`fairlane serve --dev`, the engine settings
of the in-process runs as FAIRLANE_ENGINE__* variables, except the engine threads: as many as
`fairlane serve` gives its worker on this host, the cores less one): one with FCFS and one with
fairlane's policy, `priority+vtc+slo`, which serves the in-process runs named vtc, priority and slo
(each scenario's requests are all of one tier, or have no latency targets, where a part of it does
nothing). Every run makes fresh tenants over the admin REST API (one per trace tenant, with its
weight and latency targets, every tier allowed) and a key each, then replays the trace on the wall
clock: streamed completions through the official `openai` client, each tenant's from a process of
its own (one loop holding every stream is a queue of its own), the same prompt lengths (token ids
of whole words, benchmarks/sched_prompts.py; every request a server sees has a prompt of its own,
so nothing is in its prefix cache) and output lengths (`ignore_eos`, greedy), `service_tier`
"priority" for the trace's priority 1 and "standard" for the rest. Streams still open at a run's
end are closed (the server aborts them) and the next run starts once the lanes and the engine are
empty.

Measured from the client: TTFT (send to first chunk), finish, refusals (429/503 or an error in the
stream), the weighted service each tenant received over time (chunk arrival times). From the
server: the split of each TTFT (benchmarks/sched_http_timeline.py, from the spans the servers print
with `otel_console`; `--no-spans` turns them off and leaves only the client's and the gateway's
TTFT), and per run the means of the Prometheus histograms fairlane_lane_queue_seconds and
fairlane_ttft_seconds by tier, the growth of fairlane_engine_preemptions, and how often the
gateway's event loop woke more than 10, 50 and 100 ms late and its GC paused over 10 ms; each
client process notes its own loop's lateness too (a client stall is not the server's).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks import sched_http_timeline as timeline
from benchmarks.sched_http_client import START_AHEAD_S, close_clients
from benchmarks.sched_http_driver import TIERS, Server, replay, service
from engine.sim import SimReport

POLICY = "priority+vtc+slo"
SPAN_FLUSH_S = 0.3  # the span processors export at least every 100 ms
# --smoke: one warm-up round of a few streams per server, and the clients told t0 this much ahead of
# the first arrival (their processes are up and their imports done after the first run)
SMOKE_WARM_UP = {"warm_up_rounds": 1, "warm_up_streams": 8}
SMOKE_START_AHEAD_S = 0.2


class HTTP:
    """The scheduling benchmark's driver over HTTP (see benchmarks.scheduling.InProcess)."""

    name, where = "scheduling_http", "fairlane serve, HTTP"
    waits_header = (
        "| run | TTFT client / gateway (mean) | mean split | slowest: TTFT and split |",
        "| --- | --- | --- | --- |",
    )
    line = staticmethod(timeline.line)

    def __init__(self, engine: dict, *, spans: bool = True, keep_logs: bool = False, smoke: bool = False):
        self.engine, self.spans, self.keep_logs, self.smoke = dict(engine), spans, keep_logs, smoke
        self.servers: dict[str, Server] = {}
        self.read: dict[str, int] = {}  # bytes of each server's log already read
        self.workdir = Path(tempfile.mkdtemp(prefix="fairlane-sched-http-"))

    def __enter__(self) -> HTTP:
        started = time.monotonic()
        policies = {"fcfs": "fcfs", "policy": POLICY}
        with ThreadPoolExecutor(len(policies)) as pool:
            futures = {
                key: pool.submit(
                    Server.start,
                    self.engine["model"],
                    policy,
                    self.engine,
                    self.workdir / key,
                    self.spans,
                    **(SMOKE_WARM_UP if self.smoke else {}),
                )
                for key, policy in policies.items()
            }
            if any(future.exception() is not None for future in futures.values()):
                for future in futures.values():  # one started while the other failed
                    if future.exception() is None:
                        future.result().served.stop()
                next(f for f in futures.values() if f.exception() is not None).result()
            self.servers = {key: future.result() for key, future in futures.items()}
        print(f"servers ready in {time.monotonic() - started:.1f} s (logs under {self.workdir})", flush=True)
        return self

    def __exit__(self, *exc) -> None:
        close_clients()
        with ThreadPoolExecutor(max(1, len(self.servers))) as pool:  # both stop at once
            list(pool.map(lambda server: server.served.stop(), self.servers.values()))
        for server in self.servers.values():
            server.http.close()
        if exc[0] is None and not self.keep_logs:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def run(self, policy: str, trace, until: float | None = None) -> SimReport:
        """`policy` is the in-process run's name: fcfs on the FCFS server, any other on fairlane's."""
        key = "fcfs" if policy == "fcfs" else "policy"
        server = self.servers[key]
        report, _ = replay(server, trace, until, SMOKE_START_AHEAD_S if self.smoke else START_AHEAD_S)
        if self.spans:
            time.sleep(SPAN_FLUSH_S)
        log = server.served.log_path.read_bytes()
        report.marks = marks = timeline.marks(log[self.read.get(key, 0) :])  # type: ignore[attr-defined]
        self.read[key] = len(log)
        t0 = report.t0  # type: ignore[attr-defined]
        sent = report.sent  # type: ignore[attr-defined]
        report.times, report.service = service(report.requests, sent, t0, marks)
        report.seen_times, report.seen_service = service(report.requests, sent, t0)  # type: ignore[attr-defined]
        report.admitted = {  # type: ignore[attr-defined]
            rid: m["admitted"] - t0 for rid, m in marks.items() if "admitted" in m
        }
        return report

    def waits(self, report: SimReport, requests) -> dict:
        return timeline.summary(report, report.marks, requests)  # type: ignore[attr-defined]

    def extra(self, report: SimReport | None) -> dict:
        if report is None:
            return {"http": {"policy": POLICY, "tiers": TIERS, "spans": self.spans}}
        return {"server": report.metrics}  # type: ignore[attr-defined]
