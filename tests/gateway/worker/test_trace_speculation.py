"""Speculative decoding on each request's engine.request span: a real Worker (real Redis, a tiny
engine with n-gram drafts) traced into the OpenTelemetry SDK's in-memory exporter."""

from __future__ import annotations

import uuid

import pytest
from gateway_test_helpers import TINY
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from engine import SamplingParams
from gateway.lanes.keys import lane_key, out_key
from gateway.lanes.messages import LaneRequest, LaneResult
from gateway.telemetry import tracing
from gateway.worker.loop import Worker

TIERS = ["priority", "standard", "batch"]  # priorities 3, 2, 1; speculation from 2 up
VOCAB = 64
# every token id of the vocabulary in the prompt: any last token is found in it, so the interactive
# tier's sequence has a draft at every step
EVERY_TOKEN = tuple(range(VOCAB))
SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "min_priority": 2}


@pytest.fixture
def exporter():
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    tracing.use_provider(provider)
    yield spans
    tracing.use_provider(None)
    provider.shutdown()


def _submit(redis, model: str, tier: str, *, n: int = 1) -> str:
    rid = f"req-{uuid.uuid4().hex[:12]}"
    sampling = SamplingParams(max_tokens=10, temperature=0.0 if n == 1 else 0.8, seed=7, n=n, ignore_eos=True)
    req = LaneRequest(
        request_id=rid, model=model, tier=tier, tenant="acme", prompt_token_ids=EVERY_TOKEN, sampling=sampling
    )
    redis.xadd(lane_key(model, tier), req.encode())
    return rid


def _run(worker, redis, rids) -> None:
    for _ in range(500):
        worker.run_once()
        results = [[LaneResult.decode(f) for _id, f in redis.xrange(out_key(rid))] for rid in rids]
        if all(r and any(x.done for x in r) for r in results):
            return
    raise AssertionError("requests did not finish")


def _engine_span(exporter, rid: str):
    (span,) = [
        s
        for s in exporter.get_finished_spans()
        if s.name == "engine.request" and s.attributes["fairlane.request_id"] == rid
    ]
    return span.attributes


def test_engine_span_carries_the_requests_speculation(exporter, redis, model_name, tiny_engine_factory):
    engine = tiny_engine_factory(dummy_config={**TINY, "vocab_size": VOCAB}, speculative_config=SPEC)
    worker = Worker(engine, redis, model=model_name, tiers=TIERS, worker_id="w-spec", block_ms=10)
    worker.setup()
    standard, batch = _submit(redis, model_name, "standard"), _submit(redis, model_name, "batch")
    _run(worker, redis, [standard, batch])
    stats = engine.stats

    spec = _engine_span(exporter, standard)
    assert spec["fairlane.spec.method"] == "ngram"
    # the only standard-tier request: its span adds up to the engine's counters of its priority
    assert spec["fairlane.spec.draft_tokens"] == stats.spec_draft_tokens_by_priority[2] > 0
    assert spec["fairlane.spec.accepted_tokens"] == stats.spec_accepted_tokens_by_priority.get(2, 0)
    rate = spec["fairlane.spec.accepted_tokens"] / spec["fairlane.spec.draft_tokens"]
    assert spec["fairlane.spec.acceptance_rate"] == pytest.approx(rate)

    plain = _engine_span(exporter, batch)  # the batch tier does not speculate
    assert plain["fairlane.spec.method"] == "ngram"
    assert plain["fairlane.spec.draft_tokens"] == plain["fairlane.spec.accepted_tokens"] == 0
    assert "fairlane.spec.acceptance_rate" not in plain
    assert engine.num_free_blocks == engine.num_total_blocks


def test_choices_are_summed_and_no_speculation_means_no_attributes(
    exporter, redis, model_name, tiny_engine_factory
):
    """n=2 sampled choices: the span sums both choices' drafts; an engine without speculation
    leaves fairlane.spec.* off its spans."""
    engine = tiny_engine_factory(dummy_config={**TINY, "vocab_size": VOCAB}, speculative_config=SPEC)
    worker = Worker(engine, redis, model=model_name, tiers=TIERS, worker_id="w-spec2", block_ms=10)
    worker.setup()
    rid = _submit(redis, model_name, "priority", n=2)
    _run(worker, redis, [rid])
    spec = _engine_span(exporter, rid)
    assert spec["fairlane.spec.draft_tokens"] == engine.stats.spec_draft_tokens > 0
    assert spec["fairlane.spec.accepted_tokens"] == engine.stats.spec_accepted_tokens

    off = tiny_engine_factory(dummy_config={**TINY, "vocab_size": VOCAB})
    worker = Worker(off, redis, model=model_name, tiers=TIERS, worker_id="w-plain", block_ms=10)
    worker.setup()
    rid = _submit(redis, model_name, "priority")
    _run(worker, redis, [rid])
    assert not [k for k in _engine_span(exporter, rid) if k.startswith("fairlane.spec.")]
