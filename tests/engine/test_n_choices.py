"""n choices of one prompt on the real SmolLM2 (fp32): choice i > 0 shares choice 0's prompt
blocks (seen in the block manager), draws with seed + i, and is exactly what an n=1 request with
that seed produces; aborts and preemption leave nothing behind."""

import pytest

from engine import LLM, SamplingParams
from engine.request import Sequence

pytestmark = pytest.mark.real_model

CHAT = [{"role": "user", "content": "Tell me a story about a cat, a dog and a very long adventure."}]


@pytest.fixture(scope="module")
def prompt(smollm2):
    return smollm2.encode(CHAT)


def test_choices_share_the_prompt_blocks_and_equal_seeded_single_requests(smollm2, prompt):
    eng, bm = smollm2.engine, smollm2.engine.block_manager
    full_blocks = (len(prompt) - 1) // bm.block_size
    assert full_blocks >= 2
    # choice 0 may find the template's leading blocks cached by earlier requests of this engine
    probe = Sequence("probe", list(prompt), len(prompt), SamplingParams())
    already = bm.num_restored_tokens(probe, bm.prefix_hits(probe))
    before = bm.num_prefix_hit_tokens
    out = smollm2.generate(
        prompt, SamplingParams(max_tokens=8, temperature=1.0, seed=7, n=3, logprobs=1, ignore_eos=True)
    )[0]
    assert (
        bm.num_prefix_hit_tokens - before == already + 2 * full_blocks * bm.block_size
    )  # choices 1, 2 shared them
    assert [c.index for c in out.choices] == [0, 1, 2] and out.token_ids == out.choices[0].token_ids
    assert len({tuple(c.token_ids) for c in out.choices}) == 3
    for i, choice in enumerate(out.choices):
        alone = smollm2.generate(
            prompt, SamplingParams(max_tokens=8, temperature=1.0, seed=7 + i, logprobs=1, ignore_eos=True)
        )[0]
        assert choice.token_ids == alone.token_ids
        assert [lp.token_id for lp in choice.logprobs] == alone.token_ids
    assert eng.num_free_blocks == eng.num_total_blocks and not eng.seqs and not eng._open and not eng._forks


def test_greedy_choices_are_the_greedy_answer(smollm2, prompt):
    greedy = smollm2.generate(prompt, SamplingParams(max_tokens=6, temperature=0))[0]
    out = smollm2.generate(
        [prompt, prompt[:20]],
        [
            SamplingParams(max_tokens=6, temperature=0, n=2),
            SamplingParams(max_tokens=4, temperature=0, presence_penalty=1),
        ],
    )
    assert [c.token_ids for c in out[0].choices] == [greedy.token_ids] * 2
    assert out[1].choices is None and len(out[1].token_ids) == 4


def test_abort_ends_every_choice_and_frees_their_blocks(smollm2, prompt):
    eng = smollm2.engine
    eng.add_request("n-abort", prompt, SamplingParams(max_tokens=50, temperature=1.0, n=4, ignore_eos=True))
    indexes = set()
    for _ in range(4):
        indexes |= {o.index for o in eng.step()}
    assert indexes == {0, 1, 2, 3} and len(eng.seqs) == 4
    assert eng.abort("n-abort") and not eng.abort("n-abort")
    assert eng.num_free_blocks == eng.num_total_blocks and not eng.seqs and not eng.has_unfinished()
    assert not eng._open and not eng._forks and not eng._choices


def test_choices_under_preemption_match(prompt):
    blocks = 2 * -(-(len(prompt) + 30) // 16)  # about two of the four sequences at once
    llm = LLM(
        model="smollm2", dtype="float32", num_threads=2, num_kv_blocks=blocks, preemption_mode="recompute"
    )
    p = SamplingParams(max_tokens=30, temperature=0.9, seed=3, n=3, ignore_eos=True)
    out = llm.generate(
        [prompt, prompt[:30]], [p, SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)]
    )
    assert llm.engine.stats.preemptions > 0
    for i, choice in enumerate(out[0].choices):
        alone = llm.generate(
            prompt, SamplingParams(max_tokens=30, temperature=0.9, seed=3 + i, ignore_eos=True)
        )[0]
        assert choice.token_ids == alone.token_ids
    assert llm.engine.num_free_blocks == blocks


def test_fairness_charges_every_choice(prompt):
    """VTC: a tenant's n=3 request costs it three times what the same n=1 request costs another."""
    llm = LLM(model="smollm2", dtype="float32", num_threads=2, policy="vtc")
    eng = llm.engine
    eng.add_request(
        "three", prompt, SamplingParams(max_tokens=6, temperature=0, n=3, ignore_eos=True), tenant="a"
    )
    eng.add_request("one", prompt, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True), tenant="b")
    while eng.has_unfinished():
        eng.step()
    counters = eng.scheduler.policy.vtc.counters
    one = len(prompt) * 1.0 + 6 * 2.0  # w_in per prompt token, w_out per output token
    assert counters["b"] == pytest.approx(one) and counters["a"] == pytest.approx(3 * one)
