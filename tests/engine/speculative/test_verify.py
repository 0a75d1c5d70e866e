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
LIST = [{"role": "user", "content": f"Write this text as a bulleted list, one sentence a line:\n{TEXT}"}]
QUOTE = [{"role": "user", "content": f"Quote the first sentence of this text twice:\n{TEXT}"}]


@pytest.fixture(scope="module")
def spec_llm():
    # a small KV cache (28 blocks of 16): the five sequences of the mixed batch must preempt (with
    # drafts of k each: longer ones finish the short replies first, and nobody is preempted)
    return LLM(
        model="smollm2",
        dtype="float32",
        num_threads=2,
        num_kv_blocks=28,
        speculative_config={**SPEC, "max_num_speculative_tokens": 4, "min_priority": 0},
    )


@pytest.fixture(scope="module")
def prompts(smollm2):
    return [smollm2.encode(p) for p in (COPY, EDIT, FREE, LIST, QUOTE)]


def _free(llm):
    eng = llm.engine
    return eng.num_free_blocks == eng.num_total_blocks and not eng.seqs


def test_greedy_mixed_batch_equals_no_speculation(smollm2, spec_llm, prompts):
    params = [SamplingParams(max_tokens=48, temperature=0, logprobs=2) for _ in prompts]
    want = smollm2.generate(prompts, params)
    stats = spec_llm.engine.stats
    before, preempted = stats.spec_accepted_tokens, stats.preemptions
    got = spec_llm.generate(prompts, params)
    assert stats.preemptions > preempted  # the small cache preempted some of them
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    for g, w in zip(got, want):
        assert [lp.token_id for lp in g.logprobs] == g.token_ids
        assert [lp.logprob for lp in g.logprobs] == pytest.approx([lp.logprob for lp in w.logprobs], abs=1e-3)
    assert stats.spec_accepted_tokens - before > 10  # the copy prompts do accept drafts
    assert _free(spec_llm)


def test_a_copied_run_takes_drafts_longer_than_k(smollm2, prompts):
    """While the reply copies its prompt the draft length doubles past k (max_num_speculative_tokens
    unset: 4 k), and the output stays the plain engine's."""
    params = SamplingParams(max_tokens=48, temperature=0)
    want = smollm2.generate([prompts[0]], params)[0].token_ids
    llm = LLM(model="smollm2", dtype="float32", num_threads=2, speculative_config={**SPEC, "min_priority": 0})
    engine = llm.engine
    engine.add_request("copy", prompts[0], params)
    got, longest = [], 0
    while engine.has_unfinished():
        for out in engine.step():
            got += out.new_token_ids
        longest = max(longest, engine.stats.last_step_spec_draft_tokens)
    assert got == want
    assert SPEC["num_speculative_tokens"] < longest <= 4 * SPEC["num_speculative_tokens"]
    assert _free(llm)


def test_stop_string_n2_and_prefix_hits_equal_no_speculation(smollm2, spec_llm, prompts):
    params = [
        SamplingParams(max_tokens=40, temperature=0, stop=["lazy dog again"]),
        SamplingParams(max_tokens=24, temperature=0, n=2),
        SamplingParams(max_tokens=24, temperature=0),
    ]
    want = smollm2.generate(prompts[:3], params)
    hits = spec_llm.engine.stats.prefix_hit_tokens
    spec_llm.generate(prompts[:3], params)  # once to fill the prefix cache, then again from it
    got = spec_llm.generate(prompts[:3], params)
    assert spec_llm.engine.block_manager.num_prefix_hit_tokens > hits
    assert [c.text for c in got] == [c.text for c in want]
    assert [c.finish_reason for c in got] == [c.finish_reason for c in want]
    assert [[x.token_ids for x in c.choices] for c in got[1:2]] == [
        [x.token_ids for x in c.choices] for c in want[1:2]
    ]
    assert got[0].finish_reason == "stop" and got[0].token_ids == want[0].token_ids
    assert _free(spec_llm)


def test_drafts_are_verified_beside_a_prefill(smollm2, spec_llm, prompts):
    eng = spec_llm.engine
    plans = []
    run = eng.runner.run

    def recording_run(plan, *args, **kwargs):
        plans.append([(bool(it.draft), it.is_decode or bool(it.draft)) for it in plan.scheduled])
        return run(plan, *args, **kwargs)

    eng.runner.run = recording_run
    try:
        greedy = SamplingParams(max_tokens=40, temperature=0)
        eng.add_request("first", prompts[0], greedy)
        tokens: dict[str, list[int]] = {"first": [], "second": []}
        while len(tokens["first"]) < 12:
            for out in eng.step():
                tokens[out.request_id] += out.new_token_ids
        eng.add_request("second", prompts[3], greedy)
        while eng.has_unfinished():
            for out in eng.step():
                tokens[out.request_id] += out.new_token_ids
    finally:
        del eng.runner.run
    # some step verified drafts while another sequence's prompt chunk ran in the same forward
    assert any(any(d for d, _ in p) and any(not dec for _, dec in p) for p in plans)
    want = smollm2.generate([prompts[0], prompts[3]], greedy)
    assert [tokens["first"], tokens["second"]] == [c.token_ids for c in want]
    assert _free(spec_llm)


def test_below_min_priority_nothing_is_drafted(spec_llm, prompts):
    stats = spec_llm.engine.stats
    before = stats.spec_verifications
    eng = spec_llm.engine
    eng.add_request("low", prompts[0], SamplingParams(max_tokens=16, temperature=0), priority=-1)
    while eng.has_unfinished():
        eng.step()
    assert stats.spec_verifications == before
