"""What lm-eval asks an OpenAI-compatible server, asked here without lm-eval: the tasks' items
(benchmarks/lm_eval_tasks), lm-eval's split of a context and a continuation into tokens, a
continuation's loglikelihood from `/v1/completions` (echo + logprobs through the official openai
client) and from a direct fp32 forward of the model, and greedy generation on both sides.

Used by benchmarks.lm_eval (its run without lm-eval, and --smoke) and by the SmolLM2 parity test.
"""

from __future__ import annotations

import json
import re
import string
from dataclasses import dataclass
from pathlib import Path

TASKS = Path(__file__).parent / "lm_eval_tasks"
MC_FILE = TASKS / "general_knowledge_mc.jsonl"
GEN_FILE = TASKS / "capitals.jsonl"
GEN_SHOTS = (
    "Q: What is the capital of France?\nA: Paris\n\nQ: What is the capital of Japan?\nA: Tokyo\n\n"
    "Q: What is the capital of Brazil?\nA: Brasilia\n\n"
)  # as fairlane_capitals.yaml writes it
GEN_MAX_TOKENS = 16


@dataclass(frozen=True)
class Request:
    """One loglikelihood request: an item's context and one choice (with lm-eval's " " before it)."""

    doc_id: int
    choice: int
    context: str
    continuation: str


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def mc_requests(docs: list[dict]) -> list[Request]:
    """The requests of fairlane_mc.yaml: "Question: ...\\nAnswer:" then " <choice>" for each choice."""
    return [
        Request(i, j, f"Question: {doc['question']}\nAnswer:", " " + choice)
        for i, doc in enumerate(docs)
        for j, choice in enumerate(doc["choices"])
    ]


def gen_prompt(doc: dict) -> str:
    return f"{GEN_SHOTS}Q: What is the capital of {doc['country']}?\nA:"


def encode_pair(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's split (`TemplateLM._encode_pair`, causal models): trailing spaces of the context
    move to the continuation; the whole text is tokenized once and the context's tokens cut off it."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    whole = tokenizer.encode(context + continuation, add_special_tokens=False)
    context_ids = tokenizer.encode(context, add_special_tokens=False)
    return context_ids, whole[len(context_ids) :]


def served_loglikelihood(
    client, model: str, context_ids: list[int], continuation_ids: list[int], *, max_tokens: int = 0
) -> tuple[float, bool]:
    """(sum of the continuation's logprobs, whether each of its tokens was the most likely) from one
    completions request with the token ids as prompt, `echo` and `logprobs: 1`. max_tokens 0 scores
    the prompt alone; lm-eval's `local-completions` sends 1 and drops the generated token's entry."""
    out = client.completions.create(
        model=model,
        prompt=[context_ids + continuation_ids],
        echo=True,
        logprobs=1,
        max_tokens=max_tokens,
        temperature=0,
    )
    lp = out.choices[0].logprobs
    n = len(context_ids) + len(continuation_ids)
    assert len(lp.token_logprobs) == n + max_tokens, (len(lp.token_logprobs), n, max_tokens)
    scored = slice(len(context_ids), n)
    greedy = all(
        tok >= max(top.values()) for tok, top in zip(lp.token_logprobs[scored], lp.top_logprobs[scored])
    )
    return float(sum(lp.token_logprobs[scored])), greedy


def direct_loglikelihood(model, context_ids: list[int], continuation_ids: list[int]) -> tuple[float, bool]:
    """The same from a Hugging Face causal LM's forward over context + continuation (as lm-eval's `hf`
    backend: the continuation's tokens scored by the logits of the positions before them)."""
    import torch

    ids = context_ids + continuation_ids
    with torch.no_grad():
        logits = model(torch.tensor([ids[:-1]])).logits[0].float()  # [len(ids) - 1, V]
    lp = torch.log_softmax(logits[len(context_ids) - 1 :], -1)  # the continuation's positions
    target = torch.tensor(continuation_ids)
    picked = lp.gather(1, target[:, None])[:, 0]
    return float(picked.sum()), bool((lp.argmax(-1) == target).all())


def served_generation(client, model: str, prompt: str) -> str:
    out = client.completions.create(
        model=model, prompt=prompt, max_tokens=GEN_MAX_TOKENS, temperature=0, stop=["\n"]
    )
    return out.choices[0].text


def direct_generation(model, tokenizer, prompt: str) -> str:
    """Greedy continuation by `generate`, cut at the first newline (the task's `until`)."""
    import torch

    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(
            ids, max_new_tokens=GEN_MAX_TOKENS, do_sample=False, pad_token_id=tokenizer.eos_token_id
        )
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True).split("\n")[0]


def exact_match(prediction: str, target: str) -> bool:
    """fairlane_capitals.yaml's metric: leading whitespace removed, case and punctuation ignored."""

    def norm(s: str) -> str:
        return re.sub(f"[{re.escape(string.punctuation)}]", "", s.lstrip().lower())

    return norm(prediction) == norm(target)


def mc_accuracy(docs: list[dict], logliks: dict[tuple[int, int], float]) -> dict[str, float]:
    """lm-eval's acc (the most likely choice is the answer) and acc_norm (likelihood per character)."""
    acc = norm = 0
    for i, doc in enumerate(docs):
        scores = [logliks[i, j] for j in range(len(doc["choices"]))]
        per_char = [s / len(c) for s, c in zip(scores, doc["choices"])]
        acc += max(range(len(scores)), key=scores.__getitem__) == doc["answer"]
        norm += max(range(len(scores)), key=per_char.__getitem__) == doc["answer"]
    return {"acc": acc / len(docs), "acc_norm": norm / len(docs)}
