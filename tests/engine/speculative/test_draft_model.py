"""Speculative decoding with a draft model on the real SmolLM2 (fp32): its own INT8 copy ("self")
drafts, the fp32 target verifies. Greedy output is token for token what decoding without drafts
gives, in a batch where a prompt arrives mid-decode, KV blocks run out (preemption by recompute or
by swap: the draft's shadow cache starts the sequence over) and a stop string cuts a request, and
for n = 2, a JSON-schema request beside a drafting one, and a prompt that hits the prefix cache;
most drafts are kept; a draft model of another vocabulary is refused."""

import json

import pytest

from benchmarks.common import tiny_model
from engine import LLM, SamplingParams, StructuredSpec
from tests.engine.paths import FP32_C, FP32_TORCH

pytestmark = pytest.mark.real_model

SELF_INT8 = {
    "method": "draft_model",
    "model": "self",
    "quantization": "int8",
    "num_speculative_tokens": 4,
    "min_priority": 0,
}
ASKS = [
    "What is the capital of France? Answer in one sentence.",
    "Write a short poem about the sea.",
    "List three colours.",
    "Explain what a CPU does, briefly.",
]


def _race(llm: LLM, max_tokens: int = 24) -> dict[str, tuple[list[int], str, str | None]]:
    """Three requests decode; a fourth arrives after four steps; request 2 stops at a string."""
    engine = llm.engine
    prompts = [llm.encode([{"role": "user", "content": ask}]) for ask in ASKS]
    out: dict[str, list] = {f"r{i}": [[], "", None] for i in range(len(ASKS))}

    def add(i: int) -> None:
        stop = ["Blue"] if i == 2 else []
        params = SamplingParams(max_tokens=max_tokens, temperature=0, stop=stop, ignore_eos=True)
        engine.add_request(f"r{i}", prompts[i], params)

    for i in range(3):
        add(i)
    steps = 0
    while engine.has_unfinished():
        if steps == 4:
            add(3)  # a prefill in a step beside speculating decodes
        for o in engine.step():
            got = out[o.request_id]
            got[0] += o.new_token_ids
            got[1] += o.new_text
            if o.finished:
                got[2] = o.finish_reason
        steps += 1
    return {k: (v[0], v[1], v[2]) for k, v in out.items()}


@pytest.mark.parametrize(
    "path, preemption_mode",
    [(FP32_C, "recompute"), (FP32_C, "swap"), (FP32_TORCH, "recompute")],
    ids=["fp32-c-recompute", "fp32-c-swap", "fp32-torch-recompute"],
)
def test_self_draft_greedy_equals_no_speculation(path, preemption_mode):
    # 16 blocks of 8 tokens: three sequences of ~40-token prompts and 24 outputs do not fit together
    kw = dict(num_kv_blocks=16, block_size=8, preemption_mode=preemption_mode, num_swap_blocks=64)
    want = _race(path.llm(**kw))
    spec = path.llm(speculative_config=SELF_INT8, **kw)
    got = _race(spec)
    assert got == want
    assert want["r2"][2] == "stop" and "Blue" not in want["r2"][1]  # the stop string cut it
    eng, stats = spec.engine, spec.engine.stats
    assert stats.preemptions > 0 and (stats.swaps > 0) == (preemption_mode == "swap")
    assert stats.spec_acceptance_rate > 0.5, stats.spec_acceptance_rate
    assert eng.num_free_blocks == eng.num_total_blocks and not eng.seqs
    assert eng.speculative_method == "draft_model"


def test_self_draft_keeps_most_drafts_and_sampled_requests_run():
    spec = FP32_C.llm(speculative_config={**SELF_INT8, "num_speculative_tokens": 5})
    prompts = [spec.encode([{"role": "user", "content": ask}]) for ask in ASKS]
    greedy = spec.generate(prompts, SamplingParams(max_tokens=32, temperature=0, ignore_eos=True))
    stats, drafter = spec.engine.stats, spec.engine.scheduler.drafter
    assert stats.spec_acceptance_rate > 0.5, stats.spec_acceptance_rate
    # most steps keep more than one token a sequence
    assert sum(len(c.token_ids) for c in greedy) > 2 * stats.spec_verifications
    assert drafter.tokens == stats.spec_draft_tokens and drafter.seconds > 0
    sampled = SamplingParams(max_tokens=16, temperature=0.8, top_p=0.9, seed=7, ignore_eos=True)
    first, again = spec.generate(prompts[:1], sampled), spec.generate(prompts[:1], sampled)
    assert first[0].token_ids == again[0].token_ids and len(first[0].token_ids) == 16  # seeded


def test_default_tier_policy_spares_priority_0_the_draft_cost():
    spec = FP32_C.llm(speculative_config={k: v for k, v in SELF_INT8.items() if k != "min_priority"})
    spec.generate([spec.encode("Hello")], SamplingParams(max_tokens=8, temperature=0))
    assert spec.engine.scheduler.drafter.forwards == 0 and spec.engine.stats.spec_draft_tokens == 0


def test_a_draft_folder_of_the_same_vocabulary_drafts_and_stays_exact():
    """A random-weight Llama with SmolLM2's tokenizer: nearly every draft is rejected, the output holds."""
    draft = {**SELF_INT8, "model": tiny_model(), "quantization": None}
    plain = FP32_C.llm()
    prompts = [plain.encode("The sea is")]
    greedy = SamplingParams(max_tokens=16, temperature=0)
    want = plain.generate(prompts, greedy)
    spec = FP32_C.llm(speculative_config=draft)
    assert [c.token_ids for c in spec.generate(prompts, greedy)] == [c.token_ids for c in want]
    assert spec.engine.stats.spec_draft_tokens > 0


def test_a_draft_of_another_vocabulary_is_refused(tiny_model_dir):
    with pytest.raises(ValueError, match="must share the target's tokenizer"):
        LLM(
            model="smollm2",
            dtype="float32",
            num_threads=1,
            speculative_config={"method": "draft_model", "model": str(tiny_model_dir)},
        )


# ---- requests of every kind beside the self-draft: n = 2, a JSON schema, a prefix-cache hit ----
SHARED = (
    "You are a helpful assistant for a hardware shop. The shop sells hammers, saws, drills, screws, "
    "nails, glue, paint, brushes and ladders. It opens at nine and closes at six, every day but "
    "Sunday. Answer in short, friendly sentences and never invent products the shop does not sell."
)
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def self_draft() -> LLM:
    return FP32_C.llm(speculative_config=SELF_INT8)


def _drive(llm: LLM, requests: list[tuple[int, str, list[int], SamplingParams]]) -> dict:
    """Each (step, id, prompt, params) added at that step; per (id, choice): (tokens, last output)."""
    engine, out, steps = llm.engine, {}, 0
    pending = sorted(requests, key=lambda r: r[0])
    while pending or engine.has_unfinished():
        while pending and pending[0][0] <= steps:
            _, rid, ids, params = pending.pop(0)
            engine.add_request(rid, ids, params)
        for o in engine.step():
            tokens, _ = out.get((o.request_id, o.index), ([], None))
            out[(o.request_id, o.index)] = (tokens + o.new_token_ids, o)
        steps += 1
    return out


def _acceptance(stats, before: tuple[int, int]) -> float:
    drafted, kept = stats.spec_draft_tokens - before[0], stats.spec_accepted_tokens - before[1]
    assert drafted > 0
    return kept / drafted


def test_self_draft_n2_greedy_choices_equal_no_speculation(smollm2, self_draft):
    """Greedy n = 2 (two identical choices: a seeded sampled pair would differ from decoding
    without drafts by design, its draws being the rejection rule's): choice 1 joins on choice 0's
    cached prompt blocks, and its draft catches up over them."""
    prompt = self_draft.encode([{"role": "user", "content": ASKS[1]}])
    params = SamplingParams(max_tokens=32, temperature=0, n=2, ignore_eos=True)
    want = smollm2.generate([prompt], params)[0]
    stats, hits = self_draft.engine.stats, self_draft.engine.block_manager.num_prefix_hit_tokens
    before = (stats.spec_draft_tokens, stats.spec_accepted_tokens)
    got = _drive(self_draft, [(0, "n2", prompt, params)])
    assert [got[("n2", i)][0] for i in (0, 1)] == [c.token_ids for c in want.choices]
    assert got[("n2", 1)][1].num_cached_tokens > 0  # choice 1 started from choice 0's blocks
    assert self_draft.engine.block_manager.num_prefix_hit_tokens > hits
    assert all(got[("n2", i)][1].num_draft_tokens > 0 for i in (0, 1))
    assert _acceptance(stats, before) > 0.5


def test_self_draft_json_schema_beside_a_drafting_request(smollm2, self_draft):
    """A JSON-schema request is not drafted (its grammar does not check drafts) while a free one in
    the same steps is; both give exactly the tokens of decoding without drafts."""
    schema = SamplingParams(max_tokens=40, temperature=0, structured=StructuredSpec.json_schema(PERSON))
    free = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
    prompts = [
        self_draft.encode([{"role": "user", "content": "Give me a JSON example about a person."}]),
        self_draft.encode([{"role": "user", "content": ASKS[3]}]),
    ]
    want = smollm2.generate(prompts, [schema, free])
    got = _drive(self_draft, [(0, "json", prompts[0], schema), (0, "free", prompts[1], free)])
    assert [got[("json", 0)][0], got[("free", 0)][0]] == [c.token_ids for c in want]
    assert want[0].finish_reason == "stop" and json.loads(want[0].text)["name"]
    assert got[("json", 0)][1].num_draft_tokens == 0 and got[("free", 0)][1].num_draft_tokens > 0


def test_self_draft_prefix_hit_equals_no_speculation_and_keeps_drafts(smollm2, self_draft):
    """A second request shares a long prompt prefix with a first one still decoding: it starts on the
    first's cached blocks (shared, live), its draft feeds the whole prompt into its shadow cache at
    their slots, and its drafts are kept as often as the first's; the outputs are the plain ones."""
    prompts = [
        self_draft.encode([{"role": "system", "content": SHARED}, {"role": "user", "content": ask}])
        for ask in ("Do you sell paint?", "When are you open on Saturday?")
    ]
    params = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
    want = smollm2.generate(prompts, params)
    stats = self_draft.engine.stats
    before = (stats.spec_draft_tokens, stats.spec_accepted_tokens)
    got = _drive(self_draft, [(0, "first", prompts[0], params), (3, "second", prompts[1], params)])
    assert [got[("first", 0)][0], got[("second", 0)][0]] == [c.token_ids for c in want]
    second = got[("second", 0)][1]
    assert second.num_cached_tokens >= 48  # the shared system prompt's full blocks
    assert second.num_draft_tokens > 0
    assert second.num_accepted_tokens / second.num_draft_tokens > 0.5
    assert _acceptance(stats, before) > 0.5
    eng = self_draft.engine
    assert eng.num_free_blocks == eng.num_total_blocks and not eng.seqs
