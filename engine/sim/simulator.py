"""A scheduling simulator: the real Scheduler and BlockManager, a step-cost model instead of a forward.

Time is virtual. Each step the simulator adds the requests that have arrived, asks the scheduler
for a plan, charges `StepCost` seconds for it, advances every scheduled sequence and appends a
dummy token to those that sample. Per request it records arrival, first token and finish times
(TTFT, TPOT), refusals and preemptions; per tenant the weighted service received, sampled every
step (w_in per prompt token computed for the first time, w_out per output token, / the weight).
A policy question is answered in well under a second of real time.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

from engine.block_manager import BlockManager
from engine.config import SchedulerConfig
from engine.errors import SLOUnattainableError
from engine.request import SamplingParams, Sequence
from engine.scheduler import Scheduler
from engine.scheduler.cost_model import split


@dataclass(frozen=True)
class StepCost:
    """seconds = step_s + prefill_token_s * prefill tokens + decode_seq_s * decoding sequences.
    The default is GPU-like: a step is dominated by reading the weights once."""

    step_s: float = 0.020
    prefill_token_s: float = 0.00002
    decode_seq_s: float = 0.0001

    def __call__(self, prefill_tokens: int, decode_seqs: int) -> float:
        return self.step_s + self.prefill_token_s * prefill_tokens + self.decode_seq_s * decode_seqs


@dataclass
class SimRequest:
    arrival: float
    prompt_len: int
    output_len: int
    tenant: str = "default"
    weight: float = 1.0
    priority: int = 0
    ttft_target_s: float | None = None
    tpot_target_s: float | None = None
    request_id: str = ""
    # filled by the simulation
    first_token: float | None = None
    finish: float | None = None
    refused: bool = False
    preemptions: int = 0

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def tpot(self) -> float | None:
        if self.finish is None or self.output_len < 2:
            return None if self.finish is None else 0.0
        assert self.first_token is not None  # a request that finished had a first token
        return (self.finish - self.first_token) / (self.output_len - 1)

    def met_slo(self) -> bool:
        """Finished, and within both targets (DistServe's goodput counts these)."""
        if self.finish is None:
            return False
        ttft, tpot = self.ttft, self.tpot
        return (self.ttft_target_s is None or (ttft is not None and ttft <= self.ttft_target_s)) and (
            self.tpot_target_s is None or (tpot is not None and tpot <= self.tpot_target_s)
        )


@dataclass
class SimReport:
    requests: list[SimRequest]
    duration: float  # virtual seconds until the last step
    steps: int
    preemptions: int
    times: list[float] = field(default_factory=list)  # after each step
    service: dict[str, list[float]] = field(
        default_factory=dict
    )  # tenant -> weighted service after each step

    def select(self, tenant: str | None = None, priority: int | None = None) -> list[SimRequest]:
        return [
            r
            for r in self.requests
            if (tenant is None or r.tenant == tenant) and (priority is None or r.priority == priority)
        ]

    def ttfts(self, **where: Any) -> list[float]:
        return [r.ttft for r in self.select(**where) if r.ttft is not None]

    def ttft_p(self, q: float, **where: Any) -> float:
        return percentile(self.ttfts(**where), q)

    def finished(self, **where: Any) -> list[SimRequest]:
        return [r for r in self.select(**where) if r.finish is not None]

    def throughput(self, until: float | None = None, **where: Any) -> float:
        """Output tokens per second of finished requests (until `until` if given)."""
        end = until or self.duration
        return (
            sum(r.output_len for r in self.finished(**where) if r.finish is not None and r.finish <= end)
            / end
        )


def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


class Simulator:
    def __init__(
        self,
        config: SchedulerConfig,
        num_blocks: int,
        cost: StepCost = StepCost(),
        w_in: float | None = None,
        w_out: float | None = None,
    ):
        self.config = config
        self.cost = cost
        self.now = 0.0
        self.block_manager = BlockManager(num_blocks, config.block_size, enable_prefix_caching=False)
        self.scheduler = Scheduler(config, self.block_manager, clock=lambda: self.now)
        self.w_in = config.vtc_input_weight if w_in is None else w_in
        self.w_out = config.vtc_output_weight if w_out is None else w_out

    def run(self, trace: list[SimRequest], until: float | None = None) -> SimReport:
        """Simulate `trace` until every request is done (or the virtual time `until`)."""
        trace = sorted(trace, key=lambda r: r.arrival)
        for i, r in enumerate(trace):
            r.request_id = r.request_id or f"r{i}"
        by_id = {r.request_id: r for r in trace}
        report = SimReport(trace, 0.0, 0, 0, service={r.tenant: [] for r in trace})
        service = dict.fromkeys(report.service, 0.0)
        prompt_done: dict[str, int] = {}  # request id -> prompt tokens computed at least once
        nxt, sched = 0, self.scheduler
        while nxt < len(trace) or sched.has_unfinished():
            if until is not None and self.now >= until:
                break
            while nxt < len(trace) and trace[nxt].arrival <= self.now:
                self._add(trace[nxt])
                nxt += 1
            plan = sched.schedule()
            for seq, _ in plan.refused:
                by_id[seq.request_id].refused = True
            if plan.is_empty:
                if nxt >= len(trace):
                    break  # nothing can ever start (cannot happen with a sane config)
                self.now = max(self.now, trace[nxt].arrival)
                continue
            dt = self.cost(*split(plan))
            sched.observe_step(plan, dt)
            samplers = [it.seq for it in plan.scheduled if it.samples]
            for it in plan.scheduled:
                seq = it.seq
                end = min(seq.num_computed_tokens + it.num_tokens, seq.num_prompt_tokens)
                new_prompt = max(0, end - prompt_done.get(seq.request_id, 0))
                prompt_done[seq.request_id] = max(end, prompt_done.get(seq.request_id, 0))
                service[seq.tenant] += (self.w_in * new_prompt + self.w_out * it.samples) / seq.weight
            sched.finish_step(plan)
            self.now += dt
            report.steps += 1
            report.preemptions += len(plan.preempted)
            for seq in samplers:
                self._sampled(seq, by_id[seq.request_id])
            report.times.append(self.now)
            for tenant, value in service.items():
                report.service[tenant].append(value)
        report.duration = self.now
        return report

    def _add(self, r: SimRequest) -> None:
        seq = Sequence(
            r.request_id,
            [1] * r.prompt_len,
            r.prompt_len,
            SamplingParams(max_tokens=r.output_len, ignore_eos=True),
            tenant=r.tenant,
            weight=r.weight,
            priority=r.priority,
            arrival_time=r.arrival,
            ttft_target_s=r.ttft_target_s,
            tpot_target_s=r.tpot_target_s,
        )
        try:
            self.scheduler.add(seq)
        except SLOUnattainableError:
            r.refused = True

    def _sampled(self, seq: Sequence, r: SimRequest) -> None:
        seq.token_ids.append(2)
        if seq.first_token_time is None:
            seq.first_token_time = r.first_token = self.now
        if seq.num_output_tokens >= r.output_len:
            r.finish = self.now
            r.preemptions = seq.num_preemptions
            self.scheduler.finish(seq)


# ---- arrival traces ----------------------------------------------------------------------------
def poisson_trace(rate: float, duration: float, rng: random.Random, **request: Any) -> list[SimRequest]:
    """Poisson arrivals at `rate`/s over [0, duration). `prompt_len` / `output_len` may be
    (lo, hi) ranges, drawn uniformly; other fields are copied to every request."""
    out, t = [], rng.expovariate(rate)
    while t < duration:
        out.append(_request(t, rng, request))
        t += rng.expovariate(rate)
    return out


def bursty_trace(
    rate: float, duration: float, rng: random.Random, burst: int = 10, **request: Any
) -> list[SimRequest]:
    """Bursts of `burst` simultaneous requests, the bursts Poisson, `rate` requests/s on average."""
    out = []
    for b in poisson_trace(rate / burst, duration, rng, prompt_len=1, output_len=1):
        out += [_request(b.arrival, rng, request) for _ in range(burst)]
    return out


def backlog(n: int, rng: random.Random, at: float = 0.0, **request: Any) -> list[SimRequest]:
    """n requests arriving at once (a backlogged tenant)."""
    return [_request(at, rng, request) for _ in range(n)]


def _request(t: float, rng: random.Random, request: dict[str, Any]) -> SimRequest:
    fields = dict(request)
    for key in ("prompt_len", "output_len"):
        v = fields.get(key, 64)
        fields[key] = rng.randint(*v) if isinstance(v, tuple) else v
    return SimRequest(arrival=t, **fields)
