"""Speculative decoding at batch 32 on the real SmolLM2: with every sequence allowed to speculate,
32 concurrent greedy requests give exactly the tokens of decoding without drafts in fp32 (and with
INT8 weights), and in bf16 on a CPU with AVX512-BF16 (what `dtype: auto` picks there), and every KV
block comes back. With the C kernels the drafts verify as decode rows of the one-call decode
forward, whose rows do not depend on each other, so a draft's row is what decoding it alone gives;
with plain torch operators they verify as prefill chunks. In bf16 through torch operators (and
through oneDNN where the CPU lacks AVX512-BF16) a chunk's rows round differently from a one-token
decode, so the two may part only at a near tie, which the plain engine's log-probabilities show."""

import pytest

from engine import LLM, SamplingParams
from engine.models.bf16_linear import bf16_library
from tests.engine.paths import (
    BF16_AMX,
    BF16_C,
    BF16_TORCH,
    FP32_C,
    FP32_TORCH,
    INT8,
    LOGPROB_TOL_BF16,
    greedy_prefix,
    params,
)

pytestmark = pytest.mark.real_model
BF16_KERNEL = bf16_library() is not None  # bf16 decodes (and drafts) in the one-call C forward

BATCH = 32
TOKENS = 16  # a request's output: enough for more than one kept draft a sequence (asserted below)
SPEC = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "prompt_lookup_min": 2,
    "prompt_lookup_max": 4,
    "min_priority": 0,
    "max_decoding_seqs": BATCH,  # the whole batch speculates (the default stops at 8 running)
}
TEXTS = [
    "The quick brown fox jumps over the lazy dog, and then the fox rests under the old oak tree.",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n",
    "Alice sent Bob the report on Monday; Bob read the report on Tuesday and replied on Wednesday.",
    "Paris is the capital of France. Berlin is the capital of Germany. Rome is the capital of Italy.",
]
SYSTEM = {"role": "system", "content": ""}
ASKS = [
    "Repeat this text exactly:",
    "Rewrite this text in the past tense:",
    "Quote the first sentence of this text twice:",
    "Write this text as a bulleted list:",
    "Summarise this text in one sentence:",
    "Translate this text into simple English:",
    "Tell me a story that starts with this text:",
    "Correct any mistakes in this text:",
]


def _prompts(tokenizer_llm: LLM) -> list[list[int]]:
    # an empty system turn: the chat template's default one would add 16 tokens to each prompt's prefill
    chats = [[SYSTEM, {"role": "user", "content": f"{ask}\n{text}"}] for ask in ASKS for text in TEXTS]
    assert len(chats) == BATCH
    return [tokenizer_llm.encode(chat) for chat in chats]


class _Counting:
    """The runner's one-call decode forward, counting its calls."""

    def __init__(self, inner):
        self.inner, self.calls = inner, 0

    def applies(self, *args):
        return self.inner.applies(*args)

    def __call__(self, *args):
        self.calls += 1
        return self.inner(*args)


def _run(llm: LLM, prompts, max_tokens: int, logprobs: int | None = None):
    greedy = SamplingParams(max_tokens=max_tokens, temperature=0, logprobs=logprobs)
    return llm.generate(prompts, greedy)


BF16_EXACT = pytest.param(
    BF16_C, id=str(BF16_C), marks=pytest.mark.skipif(not BF16_KERNEL, reason="the CPU lacks AVX512-BF16")
)
BF16_NEAR = pytest.param(
    BF16_C, id=str(BF16_C), marks=pytest.mark.skipif(BF16_KERNEL, reason="exact here: the test above")
)


@pytest.mark.parametrize("path", params([FP32_C, FP32_TORCH, INT8]) + [BF16_EXACT], ids=str)
def test_batch_of_32_greedy_equals_no_speculation(path):
    plain = path.llm()
    spec = path.llm(speculative_config=SPEC)
    prompts = _prompts(plain)
    want = _run(plain, prompts, TOKENS)
    eng, stats = spec.engine, spec.engine.stats
    widest, one_call = 0, 0
    step, decode = eng.step, eng.runner.model.decode
    counting = _Counting(decode) if decode is not None else None

    def recording_step():
        nonlocal widest, one_call
        calls = counting.calls if counting else 0
        outputs = step()
        widest = max(widest, stats.last_step_spec_seqs)
        one_call += bool(stats.last_step_spec_seqs and counting and counting.calls > calls)
        return outputs

    eng.step, eng.runner.model.decode = recording_step, counting  # type: ignore[method-assign]
    try:
        got = _run(spec, prompts, TOKENS)
    finally:
        del eng.step
        eng.runner.model.decode = decode
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    assert widest > 16  # most of the batch verified drafts in one step
    # with the C kernels, a step of decodes and drafts is one C decode call (the drafts as rows)
    assert (one_call > 0) == (path in (FP32_C, INT8, BF16_C))
    assert stats.spec_accepted_tokens > BATCH  # more than one accepted draft a sequence, on average
    assert eng.num_free_blocks == eng.num_total_blocks and not eng.seqs


# oneDNN's bf16 linears (AMX) at 32 decode rows and at 160 verification rows may round apart
@pytest.mark.parametrize("path", [BF16_NEAR] + params([BF16_AMX, BF16_TORCH]), ids=str)
def test_batch_of_32_bf16_parts_from_no_speculation_only_at_a_near_tie(path):
    plain = path.llm()
    spec = path.llm(speculative_config=SPEC)
    prompts = _prompts(plain)
    want = _run(plain, prompts, TOKENS, logprobs=2)
    got = _run(spec, prompts, TOKENS)
    agreed = 0
    for g, w in zip(got, want):
        i = greedy_prefix(w.token_ids, g.token_ids)
        agreed += i
        if i == len(w.token_ids):
            continue
        # the speculating engine chose a token the plain one ranks second, within bf16's rounding
        assert w.logprobs is not None
        top = dict(w.logprobs[i].top)
        assert g.token_ids[i] in top, (i, g.token_ids[i], top)
        assert top[w.token_ids[i]] - top[g.token_ids[i]] <= LOGPROB_TOL_BF16
    assert agreed >= 0.9 * sum(len(w.token_ids) for w in want)
    assert spec.engine.stats.spec_accepted_tokens > BATCH
    eng = spec.engine
    assert eng.num_free_blocks == eng.num_total_blocks and not eng.seqs
