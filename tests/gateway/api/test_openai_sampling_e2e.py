"""Sampling options through the official openai client against a live `fairlane serve --dev` on the
real SmolLM2 (fp32): logit_bias and penalties (held to a direct fp32 forward, Hugging Face, in this
process), n choices sharing their prompt's blocks, several prompts in one completions request,
streaming of each, cached_tokens, and bad values. Logprobs: test_openai_logprobs_e2e.py, on the
same server (tests/gateway/api/conftest.py)."""

from __future__ import annotations

import re

import httpx
import openai
import pytest
from serve_process import request_usage_records
from served_smollm2 import MAX_PROMPTS, MESSAGES, MODEL, greedy, streamed

from engine import assets
from gateway.api.tokenization import HFPromptTokenizer

# xdist: on the worker of test_openai_logprobs_e2e.py, whose server (conftest.py) it shares
pytestmark = [pytest.mark.real_model, pytest.mark.xdist_group("smollm2-fp32-server")]

REPEAT = "one two three, one two three, one two three, one two three,"


@pytest.fixture(scope="module")
def server(fp32_server):
    return fp32_server


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=server.api_key, max_retries=0)


@pytest.fixture(scope="module")
def tok():
    return HFPromptTokenizer(assets.load_tokenizer(MODEL))


@pytest.fixture(scope="module")
def hf(fp32_hf):
    return fp32_hf


def test_logit_bias_forces_and_bans_streamed_and_not(client, tok):
    plain = client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=5, temperature=0, logprobs=0
    )
    first = tok.encode_prompt(plain.choices[0].logprobs.tokens[0])
    assert len(first) == 1
    banned = client.completions.create(
        model=MODEL,
        prompt="The capital of France is",
        max_tokens=5,
        temperature=0,
        logit_bias={str(first[0]): -100},
        logprobs=0,
    )
    assert plain.choices[0].logprobs.tokens[0] not in banned.choices[0].logprobs.tokens
    forced_id = tok.encode_prompt(" banana")[0]
    stream = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=4,
        temperature=0,
        logit_bias={str(forced_id): 100},
        stream=True,
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == tok.decode([forced_id] * 4)


def test_a_banned_token_never_appears_when_sampling_streamed_and_not(client, tok):
    """-100 on the tokens a free sample uses most: sampled at temperature 1.5 none of them comes back
    (tokens compared by their exact bytes: a token's text may be shared by two tokens)."""
    kwargs = dict(
        model=MODEL,
        messages=[{"role": "user", "content": "Tell me a story about the sea."}],
        max_tokens=24,
        temperature=1.5,
        seed=9,
        n=3,
        logprobs=True,
        extra_body={"ignore_eos": True},
    )
    free = [
        bytes(e.bytes) for c in client.chat.completions.create(**kwargs).choices for e in c.logprobs.content
    ]
    ids = {b: tok.encode_prompt(b.decode("utf-8", "replace")) for b in set(free)}
    single = [b for b in ids if len(ids[b]) == 1 and tok.token_bytes(ids[b][0]) == b]
    common = sorted(single, key=free.count)[-8:]
    assert len(common) == 8
    ban = {str(ids[b][0]): -100 for b in common}
    banned = [
        bytes(e.bytes)
        for c in client.chat.completions.create(**kwargs, logit_bias=ban).choices
        for e in c.logprobs.content
    ]
    stream = client.chat.completions.create(**kwargs, logit_bias=ban, stream=True)
    streamed = [
        bytes(e.bytes) for chunk in stream for c in chunk.choices if c.logprobs for e in c.logprobs.content
    ]
    for tokens in banned, streamed:
        assert len(tokens) == 3 * 24 and not set(tokens) & set(common), set(tokens) & set(common)


@pytest.mark.parametrize("penalty", [{"frequency_penalty": 1.5}, {"presence_penalty": 1.5}])
def test_penalties_as_defined(client, tok, hf, penalty):
    ids = tok.encode_prompt(REPEAT)
    ref, _ = greedy(hf, ids, 8, **penalty)
    plain, _ = greedy(hf, ids, 8)
    assert ref != plain
    got = client.completions.create(
        model=MODEL,
        prompt=ids,
        max_tokens=8,
        temperature=0,
        **penalty,
        logprobs=0,
        extra_body={"ignore_eos": True},
    )
    assert got.choices[0].text == tok.decode(ref)
    stream = client.completions.create(
        model=MODEL,
        prompt=ids,
        max_tokens=8,
        temperature=0,
        **penalty,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    assert "".join(c.choices[0].text for c in stream if c.choices) == got.choices[0].text


def test_cached_tokens_in_usage(client):
    prompt = "Tell me a long story about a lighthouse keeper and the sea. " * 4
    client.completions.create(model=MODEL, prompt=prompt, max_tokens=1)
    again = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1)
    assert 0 < again.usage.prompt_tokens_details.cached_tokens < again.usage.prompt_tokens
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=1,
        stream=True,
        stream_options={"include_usage": True},
    )
    assert list(stream)[-1].usage.prompt_tokens_details.cached_tokens >= 0


@pytest.mark.parametrize(
    "kwargs, param",
    [
        (dict(presence_penalty=3), "presence_penalty"),
        (dict(logit_bias={"99999999": 1}), "logit_bias"),
        (dict(logprobs=True, top_logprobs=30), "top_logprobs"),
        (dict(n=129), "n"),
        (dict(response_format={"type": "json_object"}, n=2), "n"),
        (dict(response_format={"type": "xml"}), "response_format.type"),
    ],
)
def test_bad_values_are_bad_requests(client, kwargs, param):
    with pytest.raises((openai.BadRequestError, openai.UnprocessableEntityError)) as excinfo:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2, **kwargs)
    assert excinfo.value.param == param


def _prefix_hit_tokens(server) -> float:
    text = httpx.get(server.base_url + "/metrics", timeout=10).text
    return sum(
        float(v)
        for v in re.findall(r"^fairlane_engine_prefix_cache_hit_tokens_total\{[^}]*\} (\S+)$", text, re.M)
    )


def test_n_choices_share_the_prompt_and_count_it_once(server, client):
    messages = [
        {"role": "user", "content": "Write one sentence about a lighthouse on a stormy night, please."}
    ]
    before = _prefix_hit_tokens(server)
    three = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=10,
        temperature=1.0,
        seed=42,
        n=3,
        extra_body={"ignore_eos": True},
    )
    assert [c.index for c in three.choices] == [0, 1, 2]
    assert len({c.message.content for c in three.choices}) == 3
    one = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=10, temperature=0, extra_body={"ignore_eos": True}
    )
    assert three.usage.prompt_tokens == one.usage.prompt_tokens and three.usage.completion_tokens == 30
    full_blocks = (three.usage.prompt_tokens - 1) // 16
    assert (
        _prefix_hit_tokens(server) - before >= 2 * full_blocks * 16
    )  # choices 1 and 2 took choice 0's blocks
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=10,
        temperature=1.0,
        seed=42,
        n=3,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    texts = {0: "", 1: "", 2: ""}
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
    assert [texts[i] for i in range(3)] == [c.message.content for c in three.choices]
    best = client.completions.create(
        model=MODEL,
        prompt="The best fruit is",
        max_tokens=4,
        temperature=1.0,
        seed=1,
        n=2,
        best_of=4,
        logprobs=0,
    )
    assert len(best.choices) == 2 and best.usage.completion_tokens == 16
    totals = [sum(c.logprobs.token_logprobs) for c in best.choices]
    assert totals == sorted(totals, reverse=True)


def test_several_prompts_each_with_n_choices_streamed_and_not(client, tok):
    """OpenAI's order: choice prompt_index * n + i is the i-th choice of that prompt, each what the
    prompt gives alone (seeded); usage sums over the prompts."""
    prompts = ["The capital of France is", "One, two, three,", "My favourite colour is"]
    kwargs = dict(model=MODEL, max_tokens=5, temperature=1.0, seed=7, n=2, extra_body={"ignore_eos": True})
    alone = [client.completions.create(prompt=p, **kwargs) for p in prompts]
    batch = client.completions.create(prompt=prompts, **kwargs)
    assert [c.index for c in batch.choices] == list(range(6))
    assert [c.text for c in batch.choices] == [c.text for a in alone for c in a.choices]
    assert len({c.text for c in batch.choices}) == 6
    assert batch.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert batch.usage.completion_tokens == 3 * 2 * 5
    texts, _, usage = streamed(
        client.completions.create(
            prompt=prompts, stream=True, stream_options={"include_usage": True}, **kwargs
        )
    )
    assert [texts[i] for i in range(6)] == [c.text for c in batch.choices] and len(texts) == 6
    assert (usage.prompt_tokens, usage.completion_tokens) == (batch.usage.prompt_tokens, 30)


@pytest.mark.parametrize(
    "prompt, kwargs, param, message",
    [
        ([[1, 2, 3], [5, 99_999_999]], {}, "prompt", "Prompt 1's token ids"),
        (["Hello", ""], {}, "prompt", "Prompt 1 is empty"),
        (["Hello", "x" * 300_000], {}, "prompt", "Prompt 1 has 300000 characters"),
        ([[7] * 20, [7] * 9000], {}, "prompt", "Prompt 1: This model's maximum context length"),
        (["a"] * (MAX_PROMPTS + 1), {}, "prompt", f"at most {MAX_PROMPTS}"),
    ],
)
def test_one_bad_prompt_refuses_the_whole_request_uncharged(server, client, prompt, kwargs, param, message):
    with pytest.raises(openai.BadRequestError, match=re.escape(message)) as err:
        client.completions.create(model=MODEL, prompt=prompt, **{"max_tokens": 2, **kwargs})
    assert err.value.param == param
    assert (
        request_usage_records(server, err.value.response.headers["x-request-id"]) == []
    )  # refused before the quota
