"""Where a request's first token waited, from the engine's sequence events (benchmarks.scheduling).

From its arrival to its first token, a request's time goes to (seconds, summing to its TTFT):
- `in_flight`: the step that was running when it arrived (the engine takes requests between steps);
- `queue`: in the waiting queue, from being added until admitted (first `admitted` event);
- `prefill_own`: its share of the forwards that computed its prompt chunks (its tokens / the step's);
- `prefill_shared`: the rest of those forwards: other sequences' tokens in the same steps;
- `deferred`: steps after admission that ran none of its tokens (budget given to others, preempted);
- `overhead`: the remainder (scheduling, sampling, outputs, between the steps).
"""

from __future__ import annotations

import bisect
import time

from engine.sim import SimRequest

PARTS = ("in_flight", "queue", "prefill_own", "prefill_shared", "deferred", "overhead")


class Timeline:
    """Fed by the benchmark's engine loop: when each request was added, each step, each output's events."""

    def __init__(self, t0: float):
        self.wall0 = time.time() - (time.monotonic() - t0)  # event times are wall-clock
        self.added: dict[str, float] = {}
        self.events: dict[str, list] = {}
        self.step_end: list[float] = []  # seconds from t0, after each step
        self.step_seconds: list[float] = []  # its forward
        self.step_tokens: list[int] = []

    def add(self, request_id: str, now: float) -> None:
        self.added[request_id] = now

    def step(self, now: float, stats, outputs) -> None:
        self.step_end.append(now)
        self.step_seconds.append(stats.last_step_seconds)
        self.step_tokens.append(stats.last_step_tokens)
        for out in outputs:
            self.events.setdefault(out.request_id, []).extend(out.events)

    def waits(self, r: SimRequest) -> dict | None:
        """r's TTFT split into PARTS (plus `preemptions` before its first token); None if it got none."""
        if r.first_token is None or r.request_id not in self.added:
            return None
        evs = [(e.name, e.time - self.wall0, e.attrs) for e in self.events.get(r.request_id, [])]
        first = next((t for n, t, _ in evs if n == "first_token"), r.first_token)
        added = self.added[r.request_id]
        admitted = next((t for n, t, _ in evs if n == "admitted"), added)
        out = dict.fromkeys(PARTS, 0.0)
        out["in_flight"], out["queue"] = added - r.arrival, max(0.0, admitted - added)
        own_steps = set()
        for n, t, attrs in evs:
            if n == "prefill_chunk" and t <= first:
                i = min(bisect.bisect_left(self.step_end, t), len(self.step_end) - 1)
                own_steps.add(i)
                share = attrs.get("tokens", 0) / max(1, self.step_tokens[i])
                out["prefill_own"] += self.step_seconds[i] * share
                out["prefill_shared"] += self.step_seconds[i] * (1 - share)
        lo, hi = bisect.bisect_right(self.step_end, admitted), bisect.bisect_left(self.step_end, first)
        out["deferred"] = sum(self.step_seconds[i] for i in range(lo, hi + 1) if i not in own_steps)
        out["overhead"] = r.first_token - r.arrival - sum(out.values())
        out["preemptions"] = sum(n == "preempted" and t <= first for n, t, _ in evs)
        return out


def summary(timeline: Timeline, requests: list[SimRequest]) -> dict:
    """Mean of each part over `requests` that got a first token, and the split of the slowest."""
    rows = [(r.first_token - r.arrival, w) for r in requests if (w := timeline.waits(r)) is not None]
    if not rows:
        return {}
    keys = PARTS + ("preemptions",)
    mean = {k: sum(w[k] for _, w in rows) / len(rows) for k in keys}
    ttft, worst = max(rows, key=lambda x: x[0])
    return {"requests": len(rows), "mean": mean, "slowest": {"ttft": ttft, **worst}}


def line(name: str, s: dict) -> str:
    """One markdown row: the mean split (ms) and the slowest request's."""
    if not s:
        return f"| {name} | no request got a token | |"
    fmt = lambda w: ", ".join(f"{k} {1000 * w[k]:.0f}" for k in PARTS if w[k] >= 0.0005)  # noqa: E731
    return (
        f"| {name} | {fmt(s['mean'])} | {1000 * s['slowest']['ttft']:.0f}: {fmt(s['slowest'])}"
        f" ({s['slowest']['preemptions']} preempted) |"
    )
