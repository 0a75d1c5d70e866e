"""The official openai client against a live `fairlane serve --dev` on the real SmolLM2 (fp32):
logprobs, top_logprobs and echo held to a direct fp32 forward of the same model (Hugging Face, in
this process), logit_bias and penalties, n choices sharing their prompt's blocks, several prompts
in one completions request, streaming of each, cached_tokens, and bad values."""

from __future__ import annotations

import re
from collections import defaultdict

import httpx
import openai
import pytest
import torch
from serve_process import free_port, request_usage_records, start, wait_ready
from transformers import AutoModelForCausalLM

from benchmarks import lm_eval_scoring as scoring
from engine import assets
from gateway.api.tokenization import HFPromptTokenizer

pytestmark = pytest.mark.real_model

MODEL = "smollm2"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
REPEAT = "one two three, one two three, one two three, one two three,"
MAX_PROMPTS = 6  # the server's max_prompts_per_request


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve-logprobs")
    port = free_port()
    env = {
        "FAIRLANE_DATABASE_URL": f"sqlite:///{tmp / 'fairlane.db'}",
        "FAIRLANE_ENGINE__MODEL": MODEL,
        "FAIRLANE_ENGINE__DTYPE": "float32",
        "FAIRLANE_ENGINE__NUM_THREADS": "1",
        "FAIRLANE_ENGINE__MAX_NUM_SEQS": "8",
        "FAIRLANE_ENGINE__NUM_KV_BLOCKS": "128",
        "FAIRLANE_CONFIG": "/nonexistent.yaml",
        "FAIRLANE_REDIS_URL": "",
        "FAIRLANE_MAX_PROMPTS_PER_REQUEST": str(MAX_PROMPTS),
    }
    served = start(["serve", "--dev", "--port", str(port)], env, str(tmp / "serve.log"), port=port)
    served.extra["database_url"] = env["FAIRLANE_DATABASE_URL"]
    try:
        yield wait_ready(served, timeout_s=240)
    finally:
        served.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=server.api_key, max_retries=0)


@pytest.fixture(scope="module")
def tok():
    return HFPromptTokenizer(assets.load_tokenizer(MODEL))


@pytest.fixture(scope="module")
def hf(server):
    """The served weights as Hugging Face loads them (the folder the server's engine converted)."""
    path = assets.converted_dir(assets.resolve_model(MODEL))
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _log_softmax(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)  # [len(ids), V]


def _greedy(
    hf, ids: list[int], n: int, frequency_penalty: float = 0.0, presence_penalty: float = 0.0
) -> tuple[list[int], list[float]]:
    """HF greedy, a full forward per token; OpenAI's frequency and presence penalties applied by hand."""
    out, lps = [], []
    for _ in range(n):
        lp = _log_softmax(hf, ids + out)[-1]
        logits = lp.clone()  # log_softmax differs from the logits by a constant: same argmax
        for t in set(out):
            logits[t] -= frequency_penalty * out.count(t) + presence_penalty
        token = int(logits.argmax())
        out.append(token)
        lps.append(float(lp[token]))
    return out, lps


def test_chat_logprobs_equal_a_direct_forward_streamed_and_not(client, tok, hf):
    prompt = assets.encode_chat(tok.tokenizer, MESSAGES)
    ref_ids, ref_lps = _greedy(hf, prompt, 6)
    raw = _log_softmax(hf, prompt + ref_ids)
    kwargs = dict(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=5,
        extra_body={"ignore_eos": True},
    )
    content = client.chat.completions.create(**kwargs).choices[0].logprobs.content
    streamed = [
        e
        for c in client.chat.completions.create(**kwargs, stream=True)
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content
    ]
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in content]
    assert len(content) == 6
    for j, entry in enumerate(content):
        assert bytes(entry.bytes) == tok.token_bytes(ref_ids[j])
        assert abs(entry.logprob - ref_lps[j]) < 1e-4
        top = raw[len(prompt) - 1 + j].topk(5)
        assert [bytes(t.bytes) for t in entry.top_logprobs] == [
            tok.token_bytes(t) for t in top.indices.tolist()
        ]
        assert max(abs(t.logprob - v) for t, v in zip(entry.top_logprobs, top.values.tolist())) < 1e-4


def test_echo_scores_the_prompt_like_a_direct_forward(client, tok, hf):
    ids = tok.encode_prompt("The capital of France is Paris, and the capital of Italy is Rome.")
    raw = _log_softmax(hf, ids)
    scored = client.completions.create(model=MODEL, prompt=ids, max_tokens=0, echo=True, logprobs=1)
    choice = scored.choices[0]
    assert choice.text == tok.decode(ids) and scored.usage.completion_tokens == 0
    lp = choice.logprobs
    assert lp.token_logprobs[0] is None and len(lp.token_logprobs) == len(ids)
    want = [float(raw[j - 1, ids[j]]) for j in range(1, len(ids))]
    assert max(abs(a - b) for a, b in zip(lp.token_logprobs[1:], want)) < 1e-4
    # lm-eval's local-completions loglikelihood request: a batch of one token-id prompt, one token more
    lm_eval = client.completions.create(
        model=MODEL, prompt=[ids], max_tokens=1, echo=True, logprobs=1, temperature=0, seed=1234
    )
    tokens = lm_eval.choices[0].logprobs.token_logprobs
    assert len(tokens) == len(ids) + 1 and tokens[1 : len(ids)] == pytest.approx(
        lp.token_logprobs[1:], abs=1e-5
    )
    assert all(len(top) >= 1 for top in lm_eval.choices[0].logprobs.top_logprobs[1:])
    stream = client.completions.create(
        model=MODEL, prompt=ids, max_tokens=0, echo=True, logprobs=1, stream=True
    )
    chunks = [c.choices[0] for c in stream if c.choices]
    assert "".join(c.text for c in chunks) == choice.text
    assert [v for c in chunks if c.logprobs for v in c.logprobs.token_logprobs] == lp.token_logprobs


def test_lm_eval_loglikelihoods_equal_a_direct_forward(client, tok, hf):
    """lm-eval's loglikelihood requests (its context/continuation split, token-id prompts, echo) for
    fairlane_mc items, one of them after a 20-question few-shot prefix (over 256 tokens: the prompt's
    logprobs in two chunks) that a plain request has just put in the prefix cache: every
    continuation's loglikelihood and is_greedy as a direct fp32 forward's, so the same choice wins."""
    docs = scoring.read_jsonl(scoring.MC_FILE)
    shots = "".join(
        f"Question: {d['question']}\nAnswer: {d['choices'][d['answer']]}\n\n" for d in docs[10:30]
    )
    requests = scoring.mc_requests(docs[:2])
    long = [
        scoring.Request(2, r.choice, shots + r.context, r.continuation)
        for r in scoring.mc_requests(docs[2:3])
    ]
    client.completions.create(model=MODEL, prompt=shots + long[0].context, max_tokens=1)  # its blocks cached
    winners: dict[int, list] = {}
    for r in requests + long:
        context, continuation = scoring.encode_pair(tok.tokenizer, r.context, r.continuation)
        want, want_greedy = scoring.direct_loglikelihood(hf, context, continuation)
        shapes = (0, 1) if r == long[0] else (0,)  # 1: local-completions' request (a token more, dropped)
        for max_tokens in shapes:
            got, greedy = scoring.served_loglikelihood(
                client, MODEL, context, continuation, max_tokens=max_tokens
            )
            assert abs(got - want) < 1e-4 and greedy == want_greedy, (r, max_tokens, got, want)
        assert len(context) > 256 or r not in long
        winners.setdefault(r.doc_id, []).append((got, want))
    for scores in winners.values():
        assert max(range(4), key=lambda j: scores[j][0]) == max(range(4), key=lambda j: scores[j][1])


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
    ref, _ = _greedy(hf, ids, 8, **penalty)
    plain, _ = _greedy(hf, ids, 8)
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


def _streamed(stream) -> tuple[dict[int, str], dict[int, list], object]:
    """A streamed completion's text and token logprobs per choice index, and its usage chunk's usage."""
    texts: dict[int, str] = defaultdict(str)
    logprobs: dict[int, list] = defaultdict(list)
    usage = None
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.text
            logprobs[c.index] += c.logprobs.token_logprobs if c.logprobs else []
        usage = chunk.usage or usage
    return texts, logprobs, usage


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
    texts, _, usage = _streamed(
        client.completions.create(
            prompt=prompts, stream=True, stream_options={"include_usage": True}, **kwargs
        )
    )
    assert [texts[i] for i in range(6)] == [c.text for c in batch.choices] and len(texts) == 6
    assert (usage.prompt_tokens, usage.completion_tokens) == (batch.usage.prompt_tokens, 30)


def test_several_token_id_prompts_scored_like_lm_eval(client, tok, hf):
    """lm-eval's batched loglikelihood request: token-id prompts, echo, logprobs, one token more."""
    ids = [
        tok.encode_prompt(t) for t in ("The sky is blue.", "Paris is the capital of France.", "Two and two")
    ]
    scored = client.completions.create(
        model=MODEL, prompt=ids, max_tokens=1, echo=True, logprobs=1, temperature=0
    )
    assert len(scored.choices) == 3 and scored.usage.prompt_tokens == sum(map(len, ids))
    for prompt, choice in zip(ids, scored.choices):
        raw = _log_softmax(hf, prompt)
        assert choice.text.startswith(tok.decode(prompt))
        got = choice.logprobs.token_logprobs
        assert got[0] is None and len(got) == len(prompt) + 1
        want = [float(raw[j - 1, prompt[j]]) for j in range(1, len(prompt))] + [float(raw[-1].max())]
        assert max(abs(a - b) for a, b in zip(got[1:], want)) < 1e-4
    texts, logprobs, _ = _streamed(
        client.completions.create(
            model=MODEL, prompt=ids, max_tokens=1, echo=True, logprobs=1, temperature=0, stream=True
        )
    )
    assert [texts[i] for i in range(3)] == [c.text for c in scored.choices]
    assert [logprobs[i] for i in range(3)] == [c.logprobs.token_logprobs for c in scored.choices]


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
