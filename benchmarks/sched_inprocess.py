"""The scheduling benchmark's in-process driver (benchmarks.scheduling): a trace replayed on the
wall clock on a fresh engine, requests added as they arrive, the waits from the engine's events."""

from __future__ import annotations

import random
import time
from dataclasses import replace

from benchmarks.sched_prompts import prompt, word_ids
from benchmarks.sched_service import prompt_events, series
from benchmarks.sched_timeline import Timeline, line, summary
from engine import Engine, SamplingParams
from engine.errors import SLOUnattainableError
from engine.interrupts import Interrupt
from engine.sim import SimReport
from gateway.telemetry import gc_policy


def run(
    settings: dict, policy: str, trace, until: float | None = None, *, interrupt: bool = True
) -> SimReport:
    """Serve `trace` (arrival times in seconds from now) on a fresh engine of `settings` with
    `policy`. Requests arrive between steps, and with `interrupt` also between the layers of a step
    in flight, where an urgent prompt's step may run at once (engine/interrupts.py)."""
    engine = Engine(**{**settings, "policy": policy})
    # one request first, so the first forward's one-time costs are not in the first request's TTFT
    engine.add_request("warmup", list(range(100, 164)), SamplingParams(max_tokens=2, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    thresholds = gc_policy.freeze()  # as the worker does once its engine is built
    try:
        return _serve(engine, trace, until, interrupt)
    finally:
        gc_policy.thaw(thresholds)


def _serve(engine: Engine, trace, until: float | None, interrupt: bool) -> SimReport:
    rng, words = random.Random(0), word_ids(engine.tokenizer)
    trace = sorted((replace(r) for r in trace), key=lambda r: r.arrival)
    by_id = {}
    for i, r in enumerate(trace):
        r.request_id = f"r{i}"
        by_id[r.request_id] = r
    report = SimReport(trace, 0.0, 0, 0)
    outputs: list[tuple[float, str, float]] = []  # (time, tenant, service) of each output
    first_tokens: list[tuple[float, str, float]] = []  # ... of each prompt, whole at its first token
    w_in, w_out = engine.config.vtc_input_weight, engine.config.vtc_output_weight
    t0, nxt = time.monotonic(), 0
    report.timeline = timeline = Timeline(t0)

    def arrive() -> None:
        nonlocal nxt
        now = time.monotonic() - t0
        while nxt < len(trace) and trace[nxt].arrival <= now:
            r = trace[nxt]
            nxt += 1
            timeline.add(r.request_id, now)
            try:
                engine.add_request(
                    r.request_id,
                    prompt(rng, words, r.prompt_len),
                    SamplingParams(max_tokens=r.output_len, temperature=0, ignore_eos=True),
                    tenant=r.tenant,
                    weight=r.weight,
                    priority=r.priority,
                    arrival_time=t0 + r.arrival,
                    ttft_target_s=r.ttft_target_s,
                    tpot_target_s=r.tpot_target_s,
                )
            except SLOUnattainableError:
                r.refused = True

    def record(step_outputs) -> None:
        now = time.monotonic() - t0
        timeline.step(now, engine.stats, step_outputs)
        for out in step_outputs:
            r = by_id[out.request_id]
            if out.finish_reason == "slo_unattainable":
                r.refused = True
                continue
            if r.first_token is None:
                r.first_token = now
                first_tokens.append((now, r.tenant, w_in * r.prompt_len / r.weight))
            outputs.append((now, r.tenant, w_out * len(out.new_token_ids) / r.weight))
            if out.finished:
                r.finish = now
        report.steps += 1

    nested = Interrupt(poll=arrive, deliver=record) if interrupt else None
    while nxt < len(trace) or engine.has_unfinished():
        now = time.monotonic() - t0
        if until is not None and now >= until:
            break
        arrive()
        if not engine.has_unfinished():
            time.sleep(max(0.0, min(trace[nxt].arrival - now, 0.05)))
            continue
        record(engine.step(nested))
    report.duration = time.monotonic() - t0
    # each tenant's service (benchmarks/sched_service.py): prompts as their chunks were computed, and
    # (seen_*) whole at their first tokens
    tenants = {r.tenant for r in trace}
    report.seen_times, report.seen_service = series(outputs + first_tokens, tenants)  # type: ignore[attr-defined]
    events, report.admitted = list(outputs), {}  # type: ignore[attr-defined]
    for r in trace:
        evs = timeline.events.get(r.request_id, [])
        chunks = [
            (e.time - timeline.wall0, e.attrs["tokens"], e.attrs["start"])
            for e in evs
            if e.name == "prefill_chunk"
        ]
        events += prompt_events(r.tenant, r.weight, r.prompt_len, chunks, w_in)
        admitted = [e.time - timeline.wall0 for e in evs if e.name == "admitted"]
        if admitted:
            report.admitted[r.request_id] = admitted[0]  # type: ignore[attr-defined]
    report.times, report.service = series(events, tenants)
    report.preemptions = engine.stats.preemptions
    report.interrupts = engine.stats.interrupts
    return report


class InProcess:
    """Runs on a fresh engine in this process; the waits from its Timeline."""

    name, where = "scheduling", "real engine"
    waits_header = ("| run | mean | slowest |", "| --- | --- | --- |")
    line = staticmethod(line)

    def __init__(self, settings: dict, interrupt: bool = True):
        self.settings, self.interrupt = settings, interrupt

    def run(self, policy: str, trace, until: float | None = None) -> SimReport:
        return run(self.settings, policy, trace, until, interrupt=self.interrupt)

    def waits(self, report: SimReport, requests) -> dict:
        return summary(report.timeline, requests)

    def extra(self, report: SimReport | None) -> dict:
        """What a run's results add (None: the whole result's) beside the shared measures: the
        urgent prompts' steps run inside a step in flight (engine/interrupts.py)."""
        return {} if report is None else {"interrupts": report.interrupts}
