"""Penalties, logit_bias, min_tokens, logprobs and prompt logprobs on the real SmolLM2 (fp32),
held to a direct computation: Hugging Face's fp32 forward over the whole sequence at every step,
with each definition of SamplingParams applied by hand to its logits."""

import pytest
import torch

from engine import LLM, InvalidRequestError, SamplingParams

pytestmark = pytest.mark.real_model

CHAT = [{"role": "user", "content": "What is the capital of France?"}]
TEXT = "The quick brown fox jumps over the lazy dog. The quick brown fox"


@pytest.fixture(scope="module")
def prompts(smollm2):
    return {"chat": smollm2.encode(CHAT), "text": smollm2.encode(TEXT)}


def _raw_logits(hf, ids: list[int]) -> torch.Tensor:
    """[len(ids), V] fp32 logits of a direct forward (no cache)."""
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float()


def _by_hand(
    logits: torch.Tensor, p: SamplingParams, prompt: list[int], out: list[int], eos: set[int]
) -> torch.Tensor:
    """SamplingParams' definitions applied to one row, element by element (not the engine's code)."""
    logits = logits.clone()
    if len(out) < p.min_tokens:
        for t in set(p.stop_token_ids) | (set() if p.ignore_eos else eos):
            logits[t] = float("-inf")
    for t, b in p.logit_bias:
        logits[t] += b
    for t in set(prompt + out) if p.repetition_penalty != 1 else ():
        logits[t] = logits[t] / p.repetition_penalty if logits[t] > 0 else logits[t] * p.repetition_penalty
    for t in set(out):
        logits[t] -= out.count(t) * p.frequency_penalty + p.presence_penalty
    return logits


def _reference(hf, prompt: list[int], p: SamplingParams, eos: set[int]) -> tuple[list[int], list[float]]:
    """Greedy tokens under p and each chosen token's raw log-probability."""
    out, lps = [], []
    for _ in range(p.max_tokens):
        raw = _raw_logits(hf, prompt + out)[-1]
        token = int(_by_hand(raw, p, prompt, out, eos).argmax())
        out.append(token)
        lps.append(float(torch.log_softmax(raw, -1)[token]))
        if token in eos and not p.ignore_eos:
            break
    return out, lps


CASES = {
    "presence": SamplingParams(max_tokens=10, temperature=0, presence_penalty=1.5, ignore_eos=True),
    "frequency": SamplingParams(max_tokens=10, temperature=0, frequency_penalty=1.2, ignore_eos=True),
    "negative": SamplingParams(
        max_tokens=10, temperature=0, presence_penalty=-1.0, frequency_penalty=-0.5, ignore_eos=True
    ),
    "repetition": SamplingParams(max_tokens=10, temperature=0, repetition_penalty=1.5, ignore_eos=True),
    "all": SamplingParams(
        max_tokens=10,
        temperature=0,
        repetition_penalty=1.2,
        presence_penalty=0.5,
        frequency_penalty=0.5,
        logit_bias={13: 5.0},
        logprobs=3,
        ignore_eos=True,
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_penalties_match_their_definitions(smollm2, smollm2_hf, prompts, case):
    p = CASES[case]
    eos = set(smollm2.engine.eos_token_ids)
    plain = smollm2.generate(prompts["text"], SamplingParams(max_tokens=10, temperature=0, ignore_eos=True))[
        0
    ]
    got = smollm2.generate(prompts["text"], p)[0]
    ref, ref_lps = _reference(smollm2_hf, prompts["text"], p, eos)
    assert got.token_ids == ref
    assert got.token_ids != plain.token_ids  # the prompt repeats itself: every penalty changes the output
    if p.logprobs is not None:
        assert [lp.token_id for lp in got.logprobs] == ref
        assert max(abs(a.logprob - b) for a, b in zip(got.logprobs, ref_lps)) < 1e-4


def test_logit_bias_forces_and_bans(smollm2, prompts):
    ids = prompts["chat"]
    plain = smollm2.generate(ids, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))[0].token_ids
    forced = 1234
    assert forced not in plain
    out = smollm2.generate(ids, SamplingParams(max_tokens=8, temperature=0, logit_bias={forced: 100}))[0]
    assert out.token_ids == [forced] * 8
    banned = plain[0]
    out = smollm2.generate(
        ids, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logit_bias={str(banned): -100})
    )[0]
    assert banned not in out.token_ids and out.token_ids[0] != plain[0]
    sampled = smollm2.generate(
        [ids] * 3,
        SamplingParams(
            max_tokens=8, temperature=1.0, seed=5, ignore_eos=True, logit_bias={t: -100 for t in plain}
        ),
    )
    assert all(not set(c.token_ids) & set(plain) for c in sampled)  # banned at temperature 1 too


def test_min_tokens_masks_eos_until_reached(smollm2, smollm2_hf, prompts):
    ids = prompts["chat"]
    eos = set(smollm2.engine.eos_token_ids)
    short = smollm2.generate(ids, SamplingParams(max_tokens=40, temperature=0))[0]
    assert short.finish_reason == "stop" and short.token_ids[-1] in eos
    n = len(short.token_ids) + 3
    p = SamplingParams(max_tokens=n + 5, temperature=0, min_tokens=n)
    got = smollm2.generate(ids, p)[0]
    assert len(got.token_ids) >= n and not eos & set(got.token_ids[:n])
    assert got.token_ids == _reference(smollm2_hf, ids, p, eos)[0]


def test_logprobs_equal_a_direct_fp32_forward(smollm2, smollm2_hf, prompts):
    ids = prompts["chat"]
    got = smollm2.generate(ids, SamplingParams(max_tokens=6, temperature=0, logprobs=5, ignore_eos=True))[0]
    raw = torch.log_softmax(_raw_logits(smollm2_hf, ids + got.token_ids), -1)  # [P + 6, V]
    for j, lp in enumerate(got.logprobs):
        row = raw[len(ids) - 1 + j]
        assert lp.token_id == got.token_ids[j]
        assert abs(lp.logprob - float(row[lp.token_id])) < 1e-4
        top = row.topk(5)
        assert [t for t, _ in lp.top] == top.indices.tolist()
        assert max(abs(a - b) for (_, a), b in zip(lp.top, top.values.tolist())) < 1e-4
    zero = smollm2.generate(ids, SamplingParams(max_tokens=2, temperature=0, logprobs=0, ignore_eos=True))[0]
    assert [lp.top for lp in zero.logprobs] == [(), ()] and zero.logprobs[0].logprob == got.logprobs[
        0
    ].logprob


def test_logprobs_are_of_the_raw_distribution_when_sampling(smollm2, smollm2_hf, prompts):
    ids = prompts["text"]
    p = SamplingParams(max_tokens=5, temperature=1.5, top_k=20, seed=3, logprobs=1, presence_penalty=1.0)
    got = smollm2.generate(ids, p)[0]
    raw = torch.log_softmax(_raw_logits(smollm2_hf, ids + got.token_ids), -1)
    for j, lp in enumerate(got.logprobs):
        assert abs(lp.logprob - float(raw[len(ids) - 1 + j, got.token_ids[j]])) < 1e-4


def _check_prompt_logprobs(smollm2_hf, ids, plps, k):
    raw = torch.log_softmax(_raw_logits(smollm2_hf, ids), -1)
    assert plps[0] is None and len(plps) == len(ids)
    for j in range(1, len(ids)):
        assert plps[j].token_id == ids[j]
        assert abs(plps[j].logprob - float(raw[j - 1, ids[j]])) < 1e-4
        assert [t for t, _ in plps[j].top] == raw[j - 1].topk(k).indices.tolist()


def test_prompt_logprobs_with_and_without_generation(smollm2, smollm2_hf, prompts):
    ids = prompts["text"]
    score = smollm2.generate(ids, SamplingParams(max_tokens=0, prompt_logprobs=2, logprobs=1))[0]
    assert score.token_ids == [] and score.logprobs == [] and score.finish_reason == "length"
    _check_prompt_logprobs(smollm2_hf, ids, score.prompt_logprobs, 2)
    both = smollm2.generate(ids, SamplingParams(max_tokens=3, temperature=0, prompt_logprobs=0, logprobs=0))[
        0
    ]
    assert [x.logprob for x in both.prompt_logprobs[1:]] == pytest.approx(
        [x.logprob for x in score.prompt_logprobs[1:]], abs=1e-5
    )
    assert len(both.token_ids) == 3 and len(both.logprobs) == 3
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams(max_tokens=0)
    assert err.value.param == "max_tokens"


def test_prompt_logprobs_with_chunked_prefill_prefix_cache_and_preemption(smollm2_hf, prompts):
    """Chunks of 16 tokens, a cached prefix that must be recomputed for its logits, and a cache
    so small that sequences are preempted and recomputed: every row still scores its whole prompt."""
    ids = prompts["text"] * 3
    llm = LLM(
        model="smollm2",
        dtype="float32",
        num_threads=2,
        max_num_batched_tokens=16,
        num_kv_blocks=8,
        block_size=16,
        preemption_mode="recompute",
    )
    llm.generate(ids, SamplingParams(max_tokens=1, temperature=0))  # ids' blocks now in the prefix cache
    hits = llm.engine.block_manager.num_prefix_hit_tokens
    alone = llm.generate(ids, SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=1))[0]
    assert llm.engine.block_manager.num_prefix_hit_tokens == hits  # none from the cache: logits were needed
    _check_prompt_logprobs(smollm2_hf, ids, alone.prompt_logprobs, 1)
    outs = llm.generate(
        [ids, ids[:40], ids],
        [SamplingParams(max_tokens=30, temperature=0, prompt_logprobs=1, ignore_eos=True)] * 3,
    )
    assert llm.engine.stats.preemptions > 0
    for out, prompt in zip(outs, [ids, ids[:40], ids]):
        _check_prompt_logprobs(smollm2_hf, prompt, out.prompt_logprobs, 1)
    assert llm.engine.num_free_blocks == 8


def test_mixed_batch_rows_equal_each_row_alone(smollm2, prompts):
    rows = [
        (prompts["chat"], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)),
        (
            prompts["text"],
            SamplingParams(
                max_tokens=8,
                temperature=0,
                presence_penalty=1.0,
                frequency_penalty=0.7,
                logprobs=3,
                ignore_eos=True,
            ),
        ),
        (
            prompts["chat"],
            SamplingParams(max_tokens=8, temperature=0, logit_bias={11: 4.0, 30: -100}, min_tokens=8),
        ),
        (
            prompts["text"],
            SamplingParams(
                max_tokens=6,
                temperature=0,
                repetition_penalty=1.3,
                prompt_logprobs=2,
                logprobs=0,
                ignore_eos=True,
            ),
        ),
        (prompts["text"], SamplingParams(max_tokens=8, temperature=0.8, seed=11, top_p=0.9, ignore_eos=True)),
        (prompts["chat"], SamplingParams(max_tokens=0, prompt_logprobs=0)),
    ]
    together = smollm2.generate([r[0] for r in rows], [r[1] for r in rows])
    for (ids, p), batched in zip(rows, together):
        alone = smollm2.generate(ids, p)[0]
        assert batched.token_ids == alone.token_ids
        assert (batched.logprobs is None) == (p.logprobs is None)
        for a, b in zip(batched.logprobs or [], alone.logprobs or []):
            assert a.token_id == b.token_id and abs(a.logprob - b.logprob) < 1e-4
            assert [t for t, _ in a.top] == [t for t, _ in b.top]
        for a, b in zip((batched.prompt_logprobs or [])[1:], (alone.prompt_logprobs or [])[1:]):
            assert a.token_id == b.token_id and abs(a.logprob - b.logprob) < 1e-4


def test_bad_values_are_named_errors(smollm2, prompts):
    with pytest.raises(InvalidRequestError) as err:
        smollm2.generate(prompts["chat"], SamplingParams(logit_bias={smollm2.engine.vocab_size: 1}))
    assert err.value.param == "logit_bias"
    assert smollm2.engine.num_free_blocks == smollm2.engine.num_total_blocks


def test_one_pass_over_a_mixed_batch_equals_each_row_by_hand():
    """process_logits on random logits: rows that ask for nothing are left as they are, every other
    row gets exactly its own definition (the same by-hand code as above)."""
    from engine.logits_processing import process_logits
    from engine.request import Sequence

    gen = torch.Generator().manual_seed(0)
    vocab, eos = 50, {1}
    params = [
        SamplingParams(),
        SamplingParams(presence_penalty=1.5, frequency_penalty=-0.5),
        SamplingParams(repetition_penalty=1.7, logit_bias={3: 5.0, 7: -100}),
        SamplingParams(temperature=0.5),
        SamplingParams(min_tokens=9, stop_token_ids=[4], logit_bias={1: 50}, presence_penalty=0.3),
    ]
    seqs = []
    for i, p in enumerate(params):
        ids = torch.randint(0, vocab, (12,), generator=gen).tolist()
        seqs.append(Sequence(f"r{i}", ids, num_prompt_tokens=5, params=p))
    logits = torch.randn(len(seqs), vocab, generator=gen)
    want = torch.stack(
        [
            _by_hand(logits[i], s.params, s.prompt_token_ids, s.output_token_ids, eos)
            for i, s in enumerate(seqs)
        ]
    )
    got = process_logits(logits.clone(), seqs, frozenset(eos))
    assert torch.allclose(got, want, atol=1e-6)  # -inf (masked) where the definition masks
    assert torch.equal(got[0], logits[0]) and torch.equal(got[3], logits[3])
    untouched = logits[[0, 3]].clone()
    assert process_logits(untouched, [seqs[0], seqs[3]], frozenset(eos)) is untouched
