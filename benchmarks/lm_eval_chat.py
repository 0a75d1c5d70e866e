"""The pieces of benchmarks.lm_eval_parity that need no lm-eval: the fairlane_chat_qa task read
from its files (benchmarks/lm_eval_tasks), its chat prompts rendered as lm-eval's
`--apply_chat_template` renders them, and one item's answer three ways: a text prompt to
`/v1/completions`, the same prompt as token ids, and transformers' greedy `generate` in this
process, each cut at the task's stop strings as lm-eval cuts them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from benchmarks.lm_eval_scoring import TASKS

TASK = "fairlane_chat_qa"
TASK_FILE = TASKS / f"{TASK}.yaml"
SEED = 1234  # the seed lm-eval's API models put in every request


def _load_yaml(path: Path) -> dict[str, Any]:
    """A task file, lm-eval's `!function module.name` tags read as their text."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!function", lambda loader, node: loader.construct_scalar(node))
    return yaml.load(path.read_text(), Loader=Loader)  # noqa: S506 (a SafeLoader subclass)


def read_task() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The task's configuration and its items; raises ValueError naming what the files lack."""
    task = _load_yaml(TASK_FILE)
    for key in ("task", "dataset_path", "doc_to_text", "doc_to_target", "generation_kwargs"):
        if key not in task:
            raise ValueError(f"{TASK_FILE.name} has no {key!r}")
    if task["task"] != TASK or task["output_type"] != "generate_until":
        raise ValueError(f"{TASK_FILE.name} is not the generate_until task {TASK!r}")
    data = Path(task["dataset_kwargs"]["data_files"]["test"])
    data = data if data.is_absolute() else TASKS.parent.parent / data
    docs = [json.loads(line) for line in data.read_text().splitlines() if line.strip()]
    if not docs or any(set(d) != {"question", "answer"} for d in docs):
        raise ValueError(f"{data.name}: every line needs exactly 'question' and 'answer'")
    return task, docs


def user_text(task: dict[str, Any], doc: dict[str, Any]) -> str:
    """doc_to_text rendered as lm-eval renders it (a Jinja2 template over the item's fields)."""
    import jinja2

    return jinja2.Template(task["doc_to_text"], keep_trailing_newline=True).render(**doc)


def chat_prompt(tokenizer: Any, text: str) -> str:
    """What `--apply_chat_template` makes of a zero-shot item: one user turn through the model's
    chat template, the assistant's turn opened (the template adds its default system turn)."""
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )


def stop_strings(task: dict[str, Any], tokenizer: Any) -> list[str]:
    """lm-eval's stop sequences for a generate_until request: the task's `until`, plus the EOS text."""
    until = list(task["generation_kwargs"].get("until", []))
    return until + [tokenizer.eos_token] if tokenizer.eos_token not in until else until


def cut(text: str, stops: list[str]) -> str:
    """A generation up to the first of its stop strings, as lm-eval's hf backend cuts it."""
    for stop in stops:
        text = text.split(stop)[0]
    return text


def served_answer(
    http: httpx.Client, model: str, prompt: str | list[int], task: dict[str, Any], stops: list[str]
) -> dict[str, Any]:
    """The body lm-eval's `local-completions` sends for a generate_until item (its prompt as text or
    as token ids): the answer's text and the prompt tokens the server counted."""
    gen = task["generation_kwargs"]
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": gen["max_gen_toks"],
        "temperature": gen.get("temperature", 0),
        "stop": stops,
        "seed": SEED,
    }
    response = http.post("/v1/completions", json=body)
    response.raise_for_status()
    out = response.json()
    return {"text": out["choices"][0]["text"], "prompt_tokens": out["usage"]["prompt_tokens"]}


def prompt_as_ids(http: httpx.Client, model: str, prompt: str, ids: list[int]) -> dict[str, Any]:
    """Whether the server reads the text prompt as the tokenizer's ids: the same prompt sent as text
    and as those ids, each with `echo` and `logprobs` (lm-eval's loglikelihood request), must echo the
    same tokens with the same logprobs."""
    sides = {}
    for name, p in (("text", prompt), ("ids", ids)):
        body = {"model": model, "prompt": p, "max_tokens": 1, "temperature": 0, "echo": True, "logprobs": 1}
        response = http.post("/v1/completions", json=body)
        response.raise_for_status()
        sides[name] = response.json()
    text, by_ids = (sides[k]["choices"][0]["logprobs"] for k in ("text", "ids"))
    n_text = sides["text"]["usage"]["prompt_tokens"]
    return {
        "tokenizer_ids": len(ids),
        "server_prompt_tokens": n_text,
        "same": n_text == len(ids)
        and text["tokens"] == by_ids["tokens"]
        and text["token_logprobs"] == by_ids["token_logprobs"],
    }


def direct_answer(model: Any, tokenizer: Any, prompt: str, task: dict[str, Any], stops: list[str]) -> str:
    """transformers' greedy `generate` on the prompt as lm-eval's hf backend encodes it (special
    tokens' text as control tokens, no tokens added), decoded without special tokens and cut."""
    import torch

    ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(
            ids,
            max_new_tokens=task["generation_kwargs"]["max_gen_toks"],
            do_sample=False,
            pad_token_id=tokenizer.eos_token_id,
        )
    return cut(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True), stops)
