"""The prompt checks the engine and the gateway share, and Engine.add with an EngineRequest."""

from __future__ import annotations

import pytest

from engine import (
    ContextLengthExceededError,
    EngineRequest,
    ErrorCode,
    InvalidRequestError,
    SamplingParams,
    check_context,
    check_prompt,
)


@pytest.mark.parametrize(
    "ids, message",
    [([], "Prompt 2 is empty."), ([1, 600], "Prompt 2's token ids must be below"), ([1, True], "integers")],
)
def test_a_bad_prompt_is_refused_in_the_same_words_everywhere(ids, message):
    with pytest.raises(InvalidRequestError, match=message) as err:
        check_prompt(ids, vocab_size=512, name="Prompt 2")
    assert err.value.param == "prompt" and err.value.code == ErrorCode.INVALID_REQUEST


def test_the_context_check_names_the_prompt_or_max_tokens():
    check_context(200, 56, max_model_len=256)  # fits exactly
    with pytest.raises(ContextLengthExceededError, match="300 were requested") as err:
        check_context(200, 100, max_model_len=256)
    assert err.value.param == "max_tokens" and err.value.code == "context_length_exceeded"
    with pytest.raises(ContextLengthExceededError, match="the prompt has 300 tokens") as err:
        check_context(300, 1, max_model_len=256, prompt_param="messages")
    assert err.value.param == "messages"


def test_engine_add_queues_an_engine_request(tiny_model_dir):
    from engine import Engine

    tiny_engine = Engine(model=str(tiny_model_dir), dtype="float32", block_size=4, kv_cache_gib=0.01)
    tiny_engine.add(EngineRequest("r", (1, 2, 3), SamplingParams(max_tokens=2, temperature=0), tenant="t"))
    outputs = []
    while tiny_engine.has_unfinished():
        outputs.extend(tiny_engine.step())
    assert outputs[-1].request_id == "r" and outputs[-1].num_output_tokens == 2
