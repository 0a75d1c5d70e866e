"""The worker's Prometheus metrics of its engine (gateway/worker/telemetry.py): a mixture of experts'
experts run and the weight bytes its steps read, as the engine counts them."""

from __future__ import annotations

import uuid

from prometheus_client import REGISTRY

from engine import LLM, SamplingParams
from gateway.worker.telemetry import EngineMetrics
from tests.engine.models.families import save_family


def _counter(name: str, worker_id: str) -> float:
    return REGISTRY.get_sample_value(f"fairlane_engine_{name}_total", {"worker": worker_id}) or 0.0


def test_moe_experts_and_weight_bytes_are_exported(tmp_path):
    folder = save_family("mixtral", tmp_path / "mixtral")
    engine = LLM(model=str(folder), dtype="float32", num_threads=1, num_kv_blocks=16).engine
    worker_id = f"w-{uuid.uuid4().hex[:6]}"
    metrics = EngineMetrics(engine, worker_id)
    engine.add_request("a", [3, 4, 5, 6], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
        metrics.update()
    stats = engine.stats
    assert stats.experts_touched >= 4 * 2 * 3  # 4 steps, top-2 of 8 experts, 3 layers
    assert _counter("moe_experts_touched", worker_id) == stats.experts_touched
    assert _counter("weight_bytes_read", worker_id) == stats.weight_bytes_read > 0
