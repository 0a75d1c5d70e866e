"""Structured outputs on the real SmolLM2 (fp32): every constrained output parses and validates,
in a batch beside free rows, across preemption and when resumed from tokens generated elsewhere."""

import contextlib
import json
import re
import threading

import jsonschema
import pytest

from engine import LLM, InvalidRequestError, SamplingParams, StructuredSpec

pytestmark = pytest.mark.real_model

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
COLOR = {
    "type": "object",
    "properties": {"color": {"enum": ["red", "green", "blue"]}, "bright": {"type": "boolean"}},
    "required": ["color", "bright"],
    "additionalProperties": False,
}
POINTS = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {
            "x": {"type": "integer", "minimum": -9, "maximum": 9},
            "y": {"type": "integer", "minimum": -9, "maximum": 9},
        },
        "required": ["x", "y"],
        "additionalProperties": False,
    },
    "minItems": 1,
    "maxItems": 2,
}
SCHEMAS = [PERSON, COLOR, POINTS]
PHONE = r"\(\d{3}\) \d{3}-\d{4}"
YES_NO = 'root ::= ("yes" | "no") "."'
CHAT = [{"role": "user", "content": "Give me a small JSON example about a person, a color or some points."}]
FREE = [{"role": "user", "content": "What is the capital of France?"}]


def schema_params(schema, seed=None, temperature=1.0, max_tokens=48):
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=temperature,
        seed=seed,
        structured=StructuredSpec.json_schema(schema),
    )


def assert_valid(completion, schema):
    assert completion.finish_reason == "stop", completion.text
    jsonschema.validate(json.loads(completion.text), schema)


@pytest.fixture(scope="module")
def greedy_alone(smollm2):
    """The greedy PERSON row, run alone."""
    return smollm2.generate(CHAT, schema_params(PERSON, temperature=0))[0]


def test_full_mix_in_one_batch_every_greedy_row_as_alone(smollm2):
    """Constrained and free rows, greedy and sampled, with and without penalties, biases and
    (prompt) logprobs, in one engine batch: every constrained row is valid, every greedy row's
    tokens and logprobs are those it gets alone, free rows stay free and sampled rows differ."""
    greedy = dict(temperature=0)
    rows = [(CHAT, schema_params(schema, seed=seed), schema) for schema in SCHEMAS for seed in (1, 2)]
    rows += [  # (prompt, params, check)
        (
            CHAT,
            SamplingParams(
                max_tokens=48, **greedy, logprobs=3, structured=StructuredSpec.json_schema(PERSON)
            ),
            PERSON,
        ),
        (
            CHAT,
            SamplingParams(
                max_tokens=48,
                **greedy,
                presence_penalty=0.8,
                frequency_penalty=0.5,
                structured=StructuredSpec.json_schema(COLOR),
            ),
            COLOR,
        ),
        (
            CHAT,
            SamplingParams(
                max_tokens=24,
                **greedy,
                logprobs=0,
                repetition_penalty=1.2,
                structured=StructuredSpec("regex", PHONE),
            ),
            "regex",
        ),
        (
            CHAT,
            SamplingParams(
                max_tokens=8, **greedy, prompt_logprobs=1, structured=StructuredSpec("grammar", YES_NO)
            ),
            "ebnf",
        ),
        (
            FREE,
            SamplingParams(max_tokens=10, **greedy, frequency_penalty=1.0, logprobs=2, ignore_eos=True),
            "free",
        ),
        (
            FREE,
            SamplingParams(
                max_tokens=10,
                **greedy,
                repetition_penalty=1.3,
                logit_bias={11: 3.0, 30: -100},
                ignore_eos=True,
            ),
            "free",
        ),
        (FREE, SamplingParams(max_tokens=10, **greedy, ignore_eos=True), "free"),
        (
            CHAT,
            SamplingParams(
                max_tokens=48,
                temperature=1.0,
                seed=3,
                logprobs=1,
                presence_penalty=0.5,
                structured=StructuredSpec.json_schema(POINTS),
            ),
            POINTS,
        ),
        (
            CHAT,
            SamplingParams(max_tokens=48, temperature=1.0, seed=4, structured=StructuredSpec("json_object")),
            "object",
        ),
        (
            FREE,
            SamplingParams(
                max_tokens=10,
                temperature=0.9,
                seed=5,
                top_p=0.9,
                frequency_penalty=0.6,
                logprobs=1,
                ignore_eos=True,
            ),
            "free",
        ),
    ]
    together = smollm2.generate([r[0] for r in rows], [r[1] for r in rows])
    for (prompt, params, check), batched in zip(rows, together):
        if isinstance(check, dict):
            assert_valid(batched, check)
        elif check == "regex":
            assert batched.finish_reason == "stop" and re.fullmatch(PHONE, batched.text), batched.text
        elif check == "ebnf":
            assert batched.finish_reason == "stop" and batched.text in ("yes.", "no."), batched.text
        elif check == "object":
            assert batched.finish_reason == "stop" and isinstance(json.loads(batched.text), dict), (
                batched.text
            )
        else:  # free rows stay free
            assert len(batched.token_ids) == 10 and not batched.text.startswith("{")
        assert (batched.logprobs is None) == (params.logprobs is None)
        if params.temperature > 0:
            continue
        alone = smollm2.generate(prompt, params)[0]
        assert batched.token_ids == alone.token_ids, (batched.text, alone.text)
        for a, b in zip(batched.logprobs or [], alone.logprobs or []):
            assert a.token_id == b.token_id and abs(a.logprob - b.logprob) < 1e-4
            assert [t for t, _ in a.top] == [t for t, _ in b.top]
        assert (batched.prompt_logprobs is None) == (params.prompt_logprobs is None)
        for a, b in zip((batched.prompt_logprobs or [])[1:], (alone.prompt_logprobs or [])[1:]):
            assert a.token_id == b.token_id and abs(a.logprob - b.logprob) < 1e-4
    assert 30 not in together[11].token_ids  # the banned token
    assert len({c.text for c in together[:6]}) > 1  # sampled rows differ


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_valid_and_unchanged_across_preemption(smollm2, greedy_alone, mode):
    prompt = smollm2.encode(CHAT)
    # Two prompts fit at admission, not their growth: one spare block, and each of the running two
    # needs one more once it has 3 tokens (46-token prompts in 3 blocks), so one of them is preempted.
    blocks = 2 * -(-len(prompt) // 16) + 1
    llm = LLM(
        model="smollm2",
        dtype="float32",
        num_threads=2,
        num_kv_blocks=blocks,
        max_num_batched_tokens=64,
        preemption_mode=mode,
        enable_prefix_caching=False,
    )
    params = [
        schema_params(PERSON, temperature=0),
        schema_params(COLOR, seed=7),
        schema_params(POINTS, seed=8),
    ]
    # Their grammars compiled first: a request waits out of the scheduler while its grammar compiles
    # on a thread, so on a busy CPU one could run alone (and nothing be preempted) before the next came.
    for p in params:
        llm.engine.structured.cache.get(p.structured).result(timeout=120)
    out = llm.generate([CHAT] * 3, params)
    assert llm.engine.stats.preemptions > 0 and (llm.engine.stats.swaps > 0) == (mode == "swap")
    for completion, schema in zip(out, [PERSON, COLOR, POINTS]):
        assert_valid(completion, schema)
    assert out[0].token_ids == greedy_alone.token_ids
    assert llm.engine.num_free_blocks == blocks and not llm.engine.structured.matchers


def test_resumed_from_tokens_generated_elsewhere(smollm2, greedy_alone):
    """A worker that claims a dead worker's request rebuilds the matcher from the tokens already streamed."""
    eng = smollm2.engine
    done = greedy_alone.token_ids
    eng.add_request(
        "resumed", smollm2.encode(CHAT), schema_params(PERSON, temperature=0), resume_token_ids=done[:5]
    )
    tokens = []
    while eng.has_unfinished():
        tokens += [t for o in eng.step() for t in o.new_token_ids]
    assert done[:5] + tokens == done


class HeldCompiler:
    """The engine's grammar compiler behind a gate: each compile waits until the test opens it, so a
    request's grammar is still compiling at add_request however fast this CPU compiles a small schema.
    Counts the compiles that ran."""

    def __init__(self, compiler):
        self.compiler, self.gate, self.compiled = compiler, threading.Event(), 0

    def compile_grammar(self, grammar):
        assert self.gate.wait(timeout=120), "the test never opened the gate"
        self.compiled += 1
        return self.compiler.compile_grammar(grammar)


@contextlib.contextmanager
def compiles_held_back(engine):
    """Grammar compiles of `engine` wait for the yielded HeldCompiler's gate (opened on leaving)."""
    structured = engine.structured
    held = HeldCompiler(structured.compiler)
    structured.compiler = held
    try:
        yield held
    finally:
        held.gate.set()
        structured.compiler = held.compiler


def test_resumed_tokens_the_grammar_refuses_end_the_request_with_an_error(smollm2):
    eng = smollm2.engine
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
        "additionalProperties": False,
    }
    not_json = smollm2.tokenizer.encode("hello", add_special_tokens=False)
    # Compiled after add (held, then refused at a step):
    with compiles_held_back(eng) as compiler:
        eng.add_request("r", smollm2.encode(CHAT), schema_params(schema), resume_token_ids=not_json)
        assert "r" in eng.structured.held
        compiler.gate.set()
        outs = []
        while eng.has_unfinished():
            outs += eng.step()
    (out,) = outs
    assert out.finished and isinstance(out.error, InvalidRequestError)
    assert out.error.param == "resume_token_ids"
    assert "r" not in eng.seqs and not eng.structured.matchers and eng.num_free_blocks == eng.num_total_blocks
    # Cached (refused at add):
    with pytest.raises(InvalidRequestError, match="resumed output"):
        eng.add_request("r", smollm2.encode(CHAT), schema_params(schema), resume_token_ids=not_json)
    assert "r" not in eng.seqs and not eng.structured.matchers and eng.num_free_blocks == eng.num_total_blocks


def test_a_cold_grammar_is_held_and_the_cache_hits_after(smollm2):
    """A request whose grammar is still compiling waits off the scheduler (a step does not run it);
    aborted there, it leaves nothing behind. The grammar compiles once: the next request with the
    same schema waits on that compile, and the one after it goes straight to the scheduler."""
    eng = smollm2.engine
    schema = {  # a schema no other test uses: not in the shared engine's cache
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "cold": {"type": "integer"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    ids = smollm2.encode(CHAT)
    with compiles_held_back(eng) as compiler:
        misses = eng.structured.cache.misses
        eng.add_request("cold", ids, schema_params(schema))
        assert "cold" in eng.structured.held and eng.has_unfinished()  # compiling on a thread
        assert eng.structured.cache.misses == misses + 1
        assert eng.step() == [] and "cold" in eng.structured.held and "cold" not in eng.structured.matchers
        eng.abort("cold")  # an aborted held request leaves nothing behind
        assert not eng.structured.held and not eng.has_unfinished()
        compiler.gate.set()
        out = smollm2.generate(CHAT, schema_params(schema, seed=1))[0]
        assert_valid(out, schema)
        hits = eng.structured.cache.hits
        eng.add_request("warm", ids, schema_params(schema, seed=2))
        warm = "warm" in eng.structured.matchers and not eng.structured.held
        assert warm  # cached: straight to the scheduler
        assert eng.structured.cache.misses == misses + 1 and eng.structured.cache.hits == hits + 1
        assert compiler.compiled == 1
    eng.abort("warm")
    assert eng.num_free_blocks == eng.num_total_blocks


@pytest.mark.parametrize(
    "spec",
    [
        StructuredSpec.json_schema({"type": "integer", "minimum": 3, "maximum": 1}),
        StructuredSpec.json_schema({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}),
        StructuredSpec("regex", "[a-"),
        StructuredSpec("grammar", 'root ::= "a" rest'),
    ],
)
def test_a_grammar_xgrammar_refuses_is_an_invalid_request(smollm2, spec):
    eng = smollm2.engine
    with pytest.raises(InvalidRequestError) as err:
        eng.add_request("bad", smollm2.encode(CHAT), SamplingParams(max_tokens=8, structured=spec))
    assert (
        err.value.param
        == {"json_schema": "response_format", "regex": "guided_regex", "grammar": "guided_grammar"}[spec.kind]
    )
    assert not eng.has_unfinished() and "bad" not in eng.seqs and eng.num_free_blocks == eng.num_total_blocks
    with pytest.raises(InvalidRequestError):
        smollm2.generate(CHAT, SamplingParams(max_tokens=8, structured=spec))


def test_min_tokens_past_the_grammar_end_lets_eos_win(smollm2, caplog):
    """A grammar that is complete before min_tokens leaves its row nothing but the banned EOS: EOS
    is sampled, the output is the grammar's, and the row beside it is untouched."""
    late = SamplingParams(
        max_tokens=16, temperature=1.0, seed=7, min_tokens=12, structured=StructuredSpec("grammar", YES_NO)
    )
    beside = schema_params(COLOR, seed=8)
    with caplog.at_level("ERROR", logger="engine.structured.manager"):
        short, colour = smollm2.generate([CHAT, CHAT], [late, beside])
    assert not caplog.records  # never a token the grammar rejects
    assert short.finish_reason == "stop" and short.text in ("yes.", "no."), short.text
    assert_valid(colour, COLOR)
