"""The fairness scenario's measure (benchmarks.scheduling): each tenant's weighted service over a
run, as VTC counts it (Sheng et al., OSDI'24; engine/scheduler/vtc_counters.py): w_in per prompt
token when it is computed for the first time (a prefill chunk's end; recomputation after a
preemption is the engine's loss, not the tenant's gain) and w_out per output token, over the
tenant's weight. VTC's 2U bound is on that service while both tenants are backlogged (each has a
request waiting for admission), so the window ends at the earlier of the two tenants' last
admissions.

Beside it, the same service with each prompt counted whole at the request's first token, when the
client sees it (``at_first_token``): coarser, since a step that gives two prompts of one tenant
their first tokens moves that tenant by two whole prompts at once, even where their chunks were
computed steps apart.
"""

from __future__ import annotations

from collections.abc import Iterable


def prompt_events(
    tenant: str, weight: float, prompt_len: int, chunks: Iterable[tuple[float, int, int]], w_in: float
) -> list[tuple[float, str, float]]:
    """(time, tenant, service) of each prefill chunk (time, tokens, first position) of one request:
    the prompt tokens it computed for the first time, up to ``prompt_len``."""
    done, out = 0, []
    for at, tokens, start in sorted(chunks):
        end = min(start + tokens, prompt_len)
        if end > done:
            out.append((at, tenant, w_in * (end - done) / weight))
            done = end
    return out


def series(events: Iterable[tuple[float, str, float]], tenants: Iterable[str]) -> tuple[list[float], dict]:
    """Each tenant's cumulative service after the events of each instant, in time order: (times,
    tenant -> values). Events at the same time (one step's outputs in process) are one point."""
    totals = dict.fromkeys(tenants, 0.0)
    times: list[float] = []
    out: dict[str, list[float]] = {t: [] for t in totals}
    ordered = sorted(events)
    for i, (at, tenant, amount) in enumerate(ordered):
        totals[tenant] += amount
        if i + 1 < len(ordered) and ordered[i + 1][0] == at:
            continue
        times.append(at)
        for name, value in totals.items():
            out[name].append(value)
    return times, out


def max_gap(times: list[float], a: list[float], b: list[float], start: float, end: float) -> float:
    """The largest change of a - b over [start, end] from its value just before ``start``: the
    service one tenant got beyond the other while both were backlogged."""
    gap = [(t, x - y) for t, x, y in zip(times, a, b)]
    before = [g for t, g in gap if t < start]
    base = before[-1] if before else 0.0
    return max((abs(g - base) for t, g in gap if start <= t <= end), default=0.0)
