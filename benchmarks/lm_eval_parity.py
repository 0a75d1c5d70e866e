"""lm-eval with `--apply_chat_template`: its `local-completions` model against `fairlane serve` and
its `hf` backend on the same weights give the same answers, item by item.

    python -m benchmarks.lm_eval_parity --lm-eval-python /path/to/venv/bin/python   # lm-eval (README)
    python -m benchmarks.lm_eval_parity            # without lm-eval: its requests, sent here
    python -m benchmarks.lm_eval_parity --smoke    # the latter, on a tiny random model and 2 items

The task is fairlane_chat_qa (benchmarks/lm_eval_tasks): 50 short questions with one exact answer,
each one user turn through SmolLM2's chat template, answered greedily (32 tokens at most, up to a
blank line or the end of the turn). `fairlane serve` runs with its defaults (the packaged SmolLM2
GGUF), once per engine dtype of --dtypes (float32, and `auto`: what the engine picks on this
machine); the reference is lm-eval's `hf` backend on the Hugging Face folder the engine converts
that GGUF into, in float32. Per item and dtype, three answers are held to the reference's:
lm-eval's own `local-completions` request (lm-eval renders the template and sends its token ids),
and the same rendered prompt sent by this script to `/v1/completions` as text and as token ids
(the text prompt is read as the tokenizer reads it: its `<|im_start|>` are control tokens, checked
per item by echoing its tokens and logprobs next to the ids'). Without lm-eval, the reference is
transformers' greedy `generate` in this process. Writes lm_eval_parity.json and .png; exits 1 when
a float32 answer differs from the reference's or a text prompt is not read as the tokenizer's ids.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks import lm_eval_chat as chat
from benchmarks.common import add_common_args, done, machine, out_dir, tiny_model
from benchmarks.lm_eval import OFFLINE, smollm2_folder
from benchmarks.lm_eval_parity_report import SIDES, compare, plot, print_table
from benchmarks.round_trip import REPO, serve

MODEL_NAME = "smollm2"


def run_lm_eval(python: str, model: str, model_args: str, out: Path, env: dict, limit: int | None) -> dict:
    """One `lm_eval` run of the task with the chat template applied (from the repository root: the
    task file's paths are relative to it); its logged samples by doc_id and its scores."""
    command = [python, "-m", "lm_eval", "--model", model, "--model_args", model_args]
    command += ["--apply_chat_template", "--tasks", chat.TASK, "--include_path"]
    command += [str(chat.TASKS.relative_to(REPO)), "--batch_size", "1", "--log_samples"]
    command += ["--output_path", str(out)] + (["--limit", str(limit)] if limit else [])
    print("$", " ".join(command), flush=True)
    start = time.perf_counter()
    subprocess.run(command, cwd=REPO, env={**os.environ, **OFFLINE, **env}, check=True)
    seconds = time.perf_counter() - start
    results = json.loads(Path(sorted(glob.glob(f"{out}/**/results_*.json", recursive=True))[-1]).read_text())
    path = sorted(glob.glob(f"{out}/**/samples_{chat.TASK}_*.jsonl", recursive=True))[-1]
    samples = {s["doc_id"]: s for s in map(json.loads, Path(path).read_text().splitlines())}
    return {
        "answers": {i: s["resps"][0][0] for i, s in samples.items()},
        "prompts": {i: s["arguments"]["gen_args_0"]["arg_0"] for i, s in samples.items()},
        "scores": {m: results["results"][chat.TASK][f"{m},none"] for m in ("exact_match", "contains")},
        "seconds": round(seconds, 1),
        "command": " ".join(command[1:]),
    }


def lm_eval_version(python: str) -> str:
    return subprocess.run(
        [python, "-c", "import importlib.metadata as m; print(m.version('lm_eval'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def served_side(spec: str, dtype: str, folder: str, args, workdir: Path, items: list[dict]) -> dict:
    """`fairlane serve` for `spec` (its defaults; the engine's dtype set unless `auto`): lm-eval's
    local-completions run (with --lm-eval-python), then each item's rendered prompt as text and as ids."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    env = {} if dtype == "auto" else {"FAIRLANE_ENGINE__DTYPE": dtype}
    (workdir / dtype).mkdir()
    served = serve(spec, workdir / dtype, env=env, timeout_s=300)
    side: dict = {}
    try:
        headers = {"Authorization": f"Bearer {served.api_key}"}
        with httpx.Client(base_url=served.base_url, headers=headers, timeout=300) as http:
            model = http.get("/v1/models").json()["data"][0]["id"]
            if args.lm_eval_python:
                model_args = (
                    f"model={model},base_url={served.base_url}/v1/completions,num_concurrent=1,"
                    f"max_retries=1,tokenized_requests=True,tokenizer_backend=huggingface,tokenizer={folder}"
                )
                side["lm_eval"] = run_lm_eval(
                    args.lm_eval_python,
                    "local-completions",
                    model_args,
                    workdir / f"local-completions-{dtype}",
                    {"OPENAI_API_KEY": served.api_key},
                    args.limit,
                )
            start = time.perf_counter()
            side["text"], side["ids"], side["prompt_check"] = {}, {}, {}
            for item in items:
                ids = tokenizer(item["prompt"], add_special_tokens=False).input_ids
                i = item["doc_id"]
                side["prompt_check"][i] = chat.prompt_as_ids(http, model, item["prompt"], ids)
                side["text"][i] = chat.served_answer(http, model, item["prompt"], item["task"], item["stops"])
                side["ids"][i] = chat.served_answer(http, model, ids, item["task"], item["stops"])
            side["replay_seconds"] = round(time.perf_counter() - start, 1)
    finally:
        served.stop()
    return side


def reference_side(folder: str, args, workdir: Path, items: list[dict]) -> dict:
    """lm-eval's hf backend in float32 on `folder` (with --lm-eval-python), else transformers'
    greedy `generate` in this process on the same prompts."""
    if args.lm_eval_python:
        run = run_lm_eval(
            args.lm_eval_python,
            "hf",
            f"pretrained={folder},dtype=float32",
            workdir / "hf",
            {},
            args.limit,
        )
        return {"what": "lm-eval hf (float32)", **run}
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    start = time.perf_counter()
    answers = {
        it["doc_id"]: chat.direct_answer(model, tokenizer, it["prompt"], it["task"], it["stops"])
        for it in items
    }
    return {
        "what": "transformers generate (float32)",
        "answers": answers,
        "seconds": round(time.perf_counter() - start, 1),
        "command": None,
    }


def items_of(folder: str, limit: int | None) -> list[dict]:
    """The task's items with the chat prompt lm-eval renders for each and its stop strings."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    task, docs = chat.read_task()
    stops = chat.stop_strings(task, tokenizer)
    return [
        {
            "doc_id": i,
            "question": doc["question"],
            "target": doc["answer"],
            "prompt": chat.chat_prompt(tokenizer, chat.user_text(task, doc)),
            "task": task,
            "stops": stops,
        }
        for i, doc in enumerate(docs[:limit])
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--lm-eval-python", default=None, help="python of an environment with lm-eval 0.4 (README)"
    )
    ap.add_argument("--dtypes", default="float32,auto", help="engine dtypes of `fairlane serve`, in turn")
    ap.add_argument("--limit", type=int, default=None, help="the first N items only")
    ap.add_argument("--replot", action="store_true", help="redraw the PNG and table from the JSON")
    add_common_args(ap)
    args = ap.parse_args()
    if args.smoke and args.lm_eval_python:
        ap.error("--smoke runs without lm-eval: leave out --lm-eval-python")
    out = out_dir(args, "lm_eval_parity")
    if args.replot:
        report = json.loads((out / "lm_eval_parity.json").read_text())
        print_table(report)
        plot(report, out / "lm_eval_parity.png")
        return
    if args.smoke:
        args.dtypes, args.limit = "float32", 2
    folder = tiny_model() if args.smoke else smollm2_folder()
    spec = folder if args.smoke else MODEL_NAME
    items = items_of(str(folder), args.limit)
    from engine.device import resolve_dtype

    runs: dict = {}
    with tempfile.TemporaryDirectory(prefix="fairlane-lm-eval-parity-") as tmp:
        workdir = Path(tmp)
        for dtype in args.dtypes.split(","):
            runs[dtype] = served_side(spec, dtype, str(folder), args, workdir, items)
            runs[dtype]["engine_dtype"] = str(resolve_dtype(dtype)).removeprefix("torch.")
        reference = reference_side(str(folder), args, workdir, items)
    report = {
        "model": Path(folder).name,
        "task": chat.TASK,
        "lm_eval": lm_eval_version(args.lm_eval_python) if args.lm_eval_python else None,
        "smoke": args.smoke,
        "machine": machine(),
        "reference": {k: v for k, v in reference.items() if k not in ("answers", "prompts")},
        **compare(items, runs, reference),
    }
    (out / "lm_eval_parity.json").write_text(json.dumps(report, indent=2))
    print_table(report)
    plot(report, out / "lm_eval_parity.png")
    done(out)
    fp32 = [s for s in report["summary"] if s["engine_dtype"] == "float32"]
    if any(s[f"{side}_equal"] < s["items"] for s in fp32 for side in SIDES if f"{side}_equal" in s) or any(
        s["prompt_read_as_ids"] < s["items"] for s in report["summary"]
    ):
        sys.exit(1)


if __name__ == "__main__":
    main()
