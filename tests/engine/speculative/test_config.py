"""speculative_config is checked when the EngineConfig is made, with errors naming the key."""

import pytest

from engine import EngineConfig
from engine.speculative import SpeculativeConfig, parse_speculative_config
from engine.speculative.ngram import propose


@pytest.mark.parametrize(
    "value, message",
    [
        ({"method": "eagle"}, "method must be one of"),
        ({"num_speculative_tokens": 0}, "num_speculative_tokens must be a positive integer"),
        ({"prompt_lookup_min": 5, "prompt_lookup_max": 3}, "prompt_lookup_min (5) must be <="),
        ({"lookahead": 2}, "unknown key(s) ['lookahead']"),
        ({"min_priority": "high"}, "min_priority must be an integer"),
        ({"min_acceptance": 1.0}, "min_acceptance must be a number in [0, 1)"),
        ({"min_acceptance": -0.1}, "min_acceptance must be a number in [0, 1)"),
        ({"min_acceptance": "0.2"}, "min_acceptance must be a number in [0, 1)"),
        ({"min_acceptance": True}, "min_acceptance must be a number in [0, 1)"),
        ({"probe_interval": 0}, "probe_interval must be a positive integer"),
        ({"max_num_speculative_tokens": 0}, "max_num_speculative_tokens must be a positive integer"),
        ({"max_num_speculative_tokens": 2.5}, "max_num_speculative_tokens must be a positive integer"),
        (
            {"num_speculative_tokens": 6, "max_num_speculative_tokens": 5},
            "max_num_speculative_tokens (5) must be >= num_speculative_tokens (6)",
        ),
        (
            {"method": "draft_model", "model": "self", "max_num_speculative_tokens": 8},
            "['max_num_speculative_tokens'] do not apply to method 'draft_model'",
        ),
        ("ngram", "must be a dict or None"),
        ({"method": "draft_model"}, "model must name the draft model"),
        ({"method": "draft_model", "model": ""}, "model must name the draft model"),
        ({"method": "draft_model", "model": "self", "quantization": "fp4"}, "quantization must be None"),
        ({"method": "draft_model", "model": "self", "prompt_lookup_max": 3}, "do not apply to method"),
        ({"model": "self"}, "['model'] do not apply to method 'ngram'"),
    ],
)
def test_bad_configs_are_refused(value, message):
    with pytest.raises(ValueError) as err:
        EngineConfig(speculative_config=value)
    assert message in str(err.value)


def test_defaults_and_off():
    assert EngineConfig().speculative_config is None and parse_speculative_config(None) is None
    config = parse_speculative_config({"method": "ngram", "num_speculative_tokens": 3})
    assert config == SpeculativeConfig(num_speculative_tokens=3)
    assert config.max_num_speculative_tokens is None and config.max_draft_tokens == 12
    fixed = parse_speculative_config({"num_speculative_tokens": 3, "max_num_speculative_tokens": 3})
    assert fixed is not None and fixed.max_draft_tokens == 3
    assert (config.min_acceptance, config.probe_interval) == (0.2, 8)
    tuned = parse_speculative_config({"min_acceptance": 0, "probe_interval": 32})
    assert tuned is not None and (tuned.min_acceptance, tuned.probe_interval) == (0, 32)


def test_draft_model_config():
    value = {"method": "draft_model", "model": "self", "quantization": "int8", "num_speculative_tokens": 5}
    config = parse_speculative_config(value)
    assert config == SpeculativeConfig(
        method="draft_model", model="self", quantization="int8", num_speculative_tokens=5
    )
    assert EngineConfig(speculative_config=value).speculative_config == value


def test_prompt_lookup_takes_the_latest_longest_match():
    config = SpeculativeConfig(num_speculative_tokens=3, prompt_lookup_min=1, prompt_lookup_max=3)
    #        0  1  2  3  4  5  6  7  8  9
    tokens = [5, 6, 7, 1, 2, 5, 6, 9, 4, 5, 6]
    assert propose(tokens, config, 3) == [9, 4, 5]  # "5 6" last seen at 5..6, followed by 9 4 5
    assert propose(tokens, config, 1) == [9]
    assert propose([1, 2, 3, 4], config, 3) == []  # no earlier occurrence of any suffix
    assert propose(tokens, SpeculativeConfig(prompt_lookup_min=4, prompt_lookup_max=4), 3) == []
    assert propose(tokens, config, 8) == [9, 4, 5, 6]  # a draft goes as far as the continuation
