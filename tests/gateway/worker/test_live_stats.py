"""The console's live statistics of a worker: running sequences per tenant, latencies per priority,
KV blocks and preemptions per minute, read from a real (tiny) engine between steps."""

from __future__ import annotations

from engine import SamplingParams
from gateway.worker.live_stats import PreemptionRate, live_stats


def test_live_stats_of_a_running_engine(tiny_engine_factory):
    engine = tiny_engine_factory()
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    engine.add_request("a1", [1, 2, 3], params, tenant="acme", weight=2.0, priority=2)
    engine.add_request("a2", [4, 5, 6], params, tenant="acme", weight=2.0, priority=2)
    engine.add_request("b1", [7, 8, 9], params, tenant="beta", weight=1.0, priority=1)
    for _ in range(3):
        engine.step()
    stats = live_stats(engine, PreemptionRate())
    assert stats["tenants"] == {"acme": {"running": 2, "weight": 2.0}, "beta": {"running": 1, "weight": 1.0}}
    assert set(stats["latency"]) == {"2", "1"}
    assert stats["latency"]["2"]["sequences"] == 2 and stats["latency"]["2"]["ttft_s"] > 0
    assert stats["latency"]["1"]["tpot_s"] > 0
    assert 0 < stats["kv_used"] <= stats["kv_total"] and stats["waiting"] == 0
    assert stats["preemptions"] == 0 and stats["preemptions_per_min"] == 0.0


def test_preemptions_per_minute_over_the_last_minute():
    rate = PreemptionRate()
    assert rate.per_minute(10, 0.0) == 0.0
    assert rate.per_minute(16, 30.0) == 12.0  # 6 in 30 s
    assert rate.per_minute(16, 100.0) == 0.0  # the window holds only the last minute's samples
