"""What a worker tells the console's live view, published with every heartbeat (one JSON field).

Read from the engine between steps by the heartbeat thread: lists are copied before they are
walked, and a torn read costs one slightly wrong sample, never an error (the next beat corrects it).
Latencies are of the sequences running now: TTFT from their arrival at this engine to their first
token, TPOT over the tokens they produced since.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine import Engine

PREEMPTION_WINDOW_S = 60.0  # preemptions per minute are counted over the last minute


class PreemptionRate:
    """Preemptions per minute from the engine's running total, sampled at each beat."""

    def __init__(self) -> None:
        self.samples: deque[tuple[float, int]] = deque()

    def per_minute(self, total: int, now: float) -> float:
        self.samples.append((now, total))
        while len(self.samples) > 1 and now - self.samples[0][0] > PREEMPTION_WINDOW_S:
            self.samples.popleft()
        first_at, first = self.samples[0]
        span = now - first_at
        return 0.0 if span <= 0 else (total - first) * 60.0 / max(span, 1.0)


def live_stats(engine: Engine, rate: PreemptionRate) -> dict:
    """Running sequences per tenant (with their weights), latencies per priority, the engine's
    waiting sequences, KV blocks, preemptions and the LoRA adapters it holds (by request name)."""
    now = time.monotonic()
    tenants: dict[str, dict] = {}
    latency: dict[int, dict] = {}
    for seq in list(engine.scheduler.running):
        tenant = tenants.setdefault(seq.tenant, {"running": 0, "weight": seq.weight})
        tenant["running"] += 1
        if seq.first_token_time is None:
            continue
        lat = latency.setdefault(seq.priority, {"ttft_sum": 0.0, "tpot_sum": 0.0, "n": 0, "tpot_n": 0})
        lat["ttft_sum"] += seq.first_token_time - seq.arrival_time
        lat["n"] += 1
        produced = seq.num_output_tokens - seq.num_resumed_tokens
        if produced > 1:
            lat["tpot_sum"] += (now - seq.first_token_time) / (produced - 1)
            lat["tpot_n"] += 1
    by_priority = {
        str(p): {
            "ttft_s": v["ttft_sum"] / v["n"],
            "tpot_s": v["tpot_sum"] / v["tpot_n"] if v["tpot_n"] else None,
            "sequences": v["n"],
        }
        for p, v in latency.items()
    }
    stats = engine.stats
    lora = engine.lora
    adapters = sorted({w.name for w in list(lora.host.values())}) if lora is not None else []
    return {
        "tenants": tenants,
        "latency": by_priority,
        "waiting": engine.num_waiting,
        "preemptions": stats.preemptions,
        "preemptions_per_min": rate.per_minute(stats.preemptions, now),
        "kv_used": engine.num_total_blocks - engine.num_free_blocks,
        "kv_total": engine.num_total_blocks,
        "adapters": adapters,
    }
