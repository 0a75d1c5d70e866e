"""`fairlane serve` with n-gram speculation on (FAIRLANE_ENGINE__SPECULATIVE_CONFIG): a standard-tier
stream speculates and a batch-tier stream does not (the default min_priority), both seen in
/metrics by tier; each stream's reply equals the other's, the same greedy tokens with and without
speculation."""

from __future__ import annotations

import json
import time

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families
from serve_process import free_port, start, wait_ready

VOCAB = 64
MODEL_CONFIG = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)
# prompt_lookup_min 1 and a prompt holding every token id: whatever the model's last token, it is
# found in the prompt, so a speculating sequence drafts every step
SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2}


def _spec(base_url: str) -> dict[tuple[str, str], float]:
    """(metric, tier) -> value of the speculation counters, summed over workers."""
    got: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(httpx.get(base_url + "/metrics", timeout=10).text):
        for s in family.samples:
            if s.name.startswith("fairlane_engine_spec_") and s.name.endswith("_total"):
                key = (s.name, s.labels["tier"])
                got[key] = got.get(key, 0.0) + s.value
    return got


def _stream(client: openai.OpenAI, model: str, tier: str) -> list[str]:
    chunks = client.completions.create(
        model=model,
        prompt=list(range(VOCAB)),
        max_tokens=12,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True, "service_tier": tier},  # the completions API has no service_tier
    )
    return [c.choices[0].text for c in chunks if c.choices]


def _settled(base_url: str, before: dict, name: str, tier: str) -> float:
    """The counter's rise since `before`, once the worker's update after its last step is scraped."""
    deadline = time.monotonic() + 10
    while True:
        rise = _spec(base_url).get((name, tier), 0.0) - before.get((name, tier), 0.0)
        if rise > 0 or time.monotonic() > deadline:
            return rise
        time.sleep(0.2)


def test_standard_tier_speculates_and_batch_tier_does_not(tmp_path):
    port = free_port()
    env = {
        "FAIRLANE_DATABASE_URL": f"sqlite:///{tmp_path / 'fairlane.db'}",
        "FAIRLANE_ENGINE__MODEL": "dummy",
        "FAIRLANE_ENGINE__DUMMY_CONFIG": json.dumps(MODEL_CONFIG),
        "FAIRLANE_ENGINE__SPECULATIVE_CONFIG": json.dumps(SPEC),
        "FAIRLANE_ENGINE__NUM_THREADS": "1",
        "FAIRLANE_ENGINE__NUM_KV_BLOCKS": "64",
        "FAIRLANE_CONFIG": "",
        "FAIRLANE_REDIS_URL": "",  # the embedded server
    }
    server = start(["serve", "--dev", "--port", str(port)], env, str(tmp_path / "log"), port=port)
    try:
        wait_ready(server, timeout_s=240)
        base = server.base_url
        client = openai.OpenAI(base_url=base + "/v1", api_key=server.api_key, max_retries=0)
        model = client.models.list().data[0].id

        before = _spec(base)
        batch = _stream(client, model, "batch")
        time.sleep(1.0)  # the worker's metrics update after the stream's last step
        after_batch = _spec(base)
        for name in ("draft_tokens", "accepted_tokens", "verifications"):
            metric = f"fairlane_engine_spec_{name}_total"
            assert after_batch.get((metric, "batch"), 0.0) == before.get((metric, "batch"), 0.0)

        standard = _stream(client, model, "standard")
        drafted = _settled(base, after_batch, "fairlane_engine_spec_draft_tokens_total", "standard")
        verified = _settled(base, after_batch, "fairlane_engine_spec_verifications_total", "standard")
        assert drafted >= verified > 0, server.log()
        accepted = _spec(base).get(("fairlane_engine_spec_accepted_tokens_total", "standard"), 0.0)
        assert 0 <= accepted <= drafted
        assert _spec(base).get(("fairlane_engine_spec_draft_tokens_total", "batch"), 0.0) == 0.0
        assert "".join(standard) == "".join(batch) != ""  # greedy: speculation exact
    finally:
        server.stop()
