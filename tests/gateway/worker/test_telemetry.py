"""The worker's Prometheus metrics of its engine (gateway/worker/telemetry.py): a mixture of experts'
experts run and the weight bytes its steps read, speculative decoding by tier, as the engine counts them."""

from __future__ import annotations

import uuid

from prometheus_client import REGISTRY

from engine import LLM, SamplingParams
from gateway.worker.telemetry import EngineMetrics
from tests.engine.models.families import save_family

# a model of 64 token ids: a prompt can hold each of them
TINY_VOCAB = dict(
    vocab_size=64,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)


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


def test_speculation_is_exported_by_tier(tmp_path):
    """n-gram drafts from a prompt holding every token of the vocabulary (any last token is found in
    it: a draft every step): the priority tier's sequence speculates and is counted under its tier's
    label; the batch tier's (priority below min_priority) drafts nothing."""
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "min_priority": 2}
    engine = LLM(
        model="dummy",
        dummy_config=TINY_VOCAB,
        dtype="float32",
        num_threads=1,
        num_kv_blocks=32,
        speculative_config=spec,
    ).engine
    worker_id = f"w-{uuid.uuid4().hex[:6]}"
    metrics = EngineMetrics(engine, worker_id, ["priority", "standard", "batch"])  # priorities 3, 2, 1
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    every_token = list(range(TINY_VOCAB["vocab_size"]))
    engine.add_request("p", every_token, params, priority=3)
    engine.add_request("b", every_token, params, priority=1)
    while engine.has_unfinished():
        engine.step()
        metrics.update()
    stats = engine.stats
    assert stats.spec_draft_tokens_by_priority.get(3, 0) > 0 and 1 not in stats.spec_draft_tokens_by_priority

    def sample(name: str, tier: str) -> float:
        labels = {"worker": worker_id, "tier": tier}
        return REGISTRY.get_sample_value(f"fairlane_engine_spec_{name}_total", labels) or 0.0

    assert sample("draft_tokens", "priority") == stats.spec_draft_tokens > 0
    assert sample("accepted_tokens", "priority") == stats.spec_accepted_tokens
    assert sample("verifications", "priority") == stats.spec_verifications > 0
    assert sample("draft_tokens", "batch") == sample("verifications", "batch") == 0
