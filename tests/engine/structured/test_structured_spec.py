"""StructuredSpec's own checks and the compiled-grammar LRU, without a model."""

import threading

import pytest

from engine import InvalidRequestError, SamplingParams, StructuredSpec
from engine.structured import GrammarCache, check


def test_spec_shapes():
    assert (
        StructuredSpec.json_schema({"type": "object", "properties": {"b": {}, "a": {}}}).value
        == '{"type": "object", "properties": {"b": {}, "a": {}}}'
    )  # property order kept
    for kind, value, param in [
        ("xml", "x", "response_format"),
        ("json_object", "{}", "response_format"),
        ("regex", " ", "guided_regex"),
        ("json_schema", "{nope", "response_format"),
        ("json_schema", "[1]", "response_format"),
        ("grammar", 5, "guided_grammar"),
    ]:
        with pytest.raises(InvalidRequestError) as err:
            StructuredSpec(kind, value)
        assert err.value.param == param


def test_sampling_params_take_the_dict_form():
    params = SamplingParams(structured={"kind": "regex", "value": "[0-9]+"})
    assert params.structured == StructuredSpec("regex", "[0-9]+")
    with pytest.raises(InvalidRequestError):
        SamplingParams(structured={"kind": "regex", "pattern": "x"})
    with pytest.raises(InvalidRequestError):
        SamplingParams(structured="[0-9]+")


@pytest.mark.parametrize(
    "spec, reason",
    [
        (StructuredSpec.json_schema({"type": "foo"}), 'Unsupported type "foo"'),
        (StructuredSpec.json_schema({"$ref": "#/$defs/missing"}), "$defs"),
        (
            StructuredSpec.json_schema({"type": "integer", "minimum": 5, "maximum": 1}),
            "minimum greater than maximum",
        ),
        (StructuredSpec("regex", "(ab"), "parenthesis is not closed"),
        (StructuredSpec("grammar", "root ::= item"), 'Rule "item" is not defined'),
    ],
)
def test_check_names_xgrammars_reason(spec, reason):
    with pytest.raises(InvalidRequestError) as err:
        check(spec)
    assert reason in err.value.message and ".cc" not in err.value.message


def test_lru_compiles_once_per_spec_and_evicts_the_least_recent():
    compiled = []
    gate = threading.Event()

    def compile_fn(spec):
        gate.wait(5)
        compiled.append(spec)
        if spec.value == "bad":
            raise ValueError("refused")
        return f"grammar of {spec.value}"

    cache = GrammarCache(compile_fn, capacity=2)
    a, b, c, bad = (StructuredSpec("regex", v) for v in ("a", "b", "c", "bad"))
    first = cache.get(a)
    assert not first.done()  # compiling on the cache's thread, not the caller's
    assert cache.get(a) is first and (cache.hits, cache.misses) == (1, 1)
    gate.set()
    assert first.result() == "grammar of a"
    cache.get(b)
    cache.get(a)  # a becomes the most recent
    cache.get(c).result()  # evicts b
    assert a in cache and c in cache and b not in cache and len(cache) == 2
    for _ in range(2):  # a failure is not cached: compiled (and refused) again
        with pytest.raises(ValueError):
            cache.get(bad).result()
    assert compiled.count(bad) == 2 and compiled.count(a) == 1
    cache.shutdown()
