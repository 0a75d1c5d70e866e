"""Logprobs through the official openai client against a live `fairlane serve --dev` on the real
SmolLM2 (fp32), held to a direct fp32 forward of the same model (Hugging Face, in this process):
chat logprobs and top_logprobs, echo, lm-eval's loglikelihood requests (one prompt and several),
streamed and not. The server is shared with test_openai_sampling_e2e.py (tests/gateway/api/conftest.py)."""

from __future__ import annotations

import openai
import pytest
from served_smollm2 import MESSAGES, MODEL, greedy, log_softmax, streamed

from benchmarks import lm_eval_scoring as scoring
from engine import assets
from gateway.api.tokenization import HFPromptTokenizer

# xdist: on the worker of test_openai_sampling_e2e.py, whose server (conftest.py) it shares
pytestmark = [pytest.mark.real_model, pytest.mark.xdist_group("smollm2-fp32-server")]


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


def test_chat_logprobs_equal_a_direct_forward_streamed_and_not(client, tok, hf):
    prompt = assets.encode_chat(tok.tokenizer, MESSAGES)
    ref_ids, ref_lps = greedy(hf, prompt, 6)
    raw = log_softmax(hf, prompt + ref_ids)
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
    raw = log_softmax(hf, ids)
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
    fairlane_mc items, one of them after a 15-question few-shot prefix (over 256 tokens: the prompt's
    logprobs in two chunks) that a plain request has just put in the prefix cache: every
    continuation's loglikelihood and is_greedy as a direct fp32 forward's, so the same choice wins."""
    docs = scoring.read_jsonl(scoring.MC_FILE)
    shots = "".join(
        f"Question: {d['question']}\nAnswer: {d['choices'][d['answer']]}\n\n" for d in docs[10:25]
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
        raw = log_softmax(hf, prompt)
        assert choice.text.startswith(tok.decode(prompt))
        got = choice.logprobs.token_logprobs
        assert got[0] is None and len(got) == len(prompt) + 1
        want = [float(raw[j - 1, prompt[j]]) for j in range(1, len(prompt))] + [float(raw[-1].max())]
        assert max(abs(a - b) for a, b in zip(got[1:], want)) < 1e-4
    texts, logprobs, _ = streamed(
        client.completions.create(
            model=MODEL, prompt=ids, max_tokens=1, echo=True, logprobs=1, temperature=0, stream=True
        )
    )
    assert [texts[i] for i in range(3)] == [c.text for c in scored.choices]
    assert [logprobs[i] for i in range(3)] == [c.logprobs.token_logprobs for c in scored.choices]
