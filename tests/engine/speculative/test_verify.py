"""Speculative decoding on the real SmolLM2 (fp32): greedy outputs token-identical to decoding
without drafts, in mixed batches with prefills, stop strings, n=2, logprobs, preemption and prefix
hits; KV blocks all given back."""

import pytest

from engine import LLM, SamplingParams

pytestmark = pytest.mark.real_model

SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
TEXT = (
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog again, "
    "and then the quick brown fox rests under the old oak tree near the river bank."
)
COPY = [{"role": "user", "content": f"Repeat this text exactly:\n{TEXT}"}]
EDIT = [{"role": "user", "content": f"Rewrite this text with 'cat' instead of 'fox':\n{TEXT}"}]
FREE = [{"role": "user", "content": "Tell me a story about a dog."}]


@pytest.fixture(scope="module")
def spec_llm():
    return LLM(
        model="smollm2", dtype="float32", num_threads=2, speculative_config={**SPEC, "min_priority": 0}
    )


@pytest.fixture(scope="module")
def prompts(smollm2):
    return [smollm2.encode(p) for p in (COPY, EDIT, FREE)]


def _free(llm):
    eng = llm.engine
    return eng.num_free_blocks == eng.num_total_blocks and not eng.seqs


def test_greedy_mixed_batch_equals_no_speculation(smollm2, spec_llm, prompts):
    params = [SamplingParams(max_tokens=48, temperature=0, logprobs=2) for _ in prompts]
    want = smollm2.generate(prompts, params)
    stats = spec_llm.engine.stats
    before = stats.spec_accepted_tokens
    got = spec_llm.generate(prompts, params)
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    for g, w in zip(got, want):
        assert [lp.token_id for lp in g.logprobs] == g.token_ids
        assert [lp.logprob for lp in g.logprobs] == pytest.approx([lp.logprob for lp in w.logprobs], abs=1e-3)
    assert stats.spec_accepted_tokens - before > 10  # the copy prompts do accept drafts
    assert _free(spec_llm)
