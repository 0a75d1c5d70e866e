"""lm-eval against `fairlane serve`: the same tasks through lm-eval's `local-completions` (fairlane's
/v1/completions) and its `hf` backend (the same weights in Hugging Face transformers), both fp32;
per-request loglikelihoods compared (within 1e-3), accuracies and generations side by side.

    python -m benchmarks.lm_eval --lm-eval-python /path/to/venv/bin/python   # lm-eval (README)
    python -m benchmarks.lm_eval            # without lm-eval: its requests, sent by the openai client
    python -m benchmarks.lm_eval --smoke    # the latter, on a tiny random model and a few items

The tasks are lm-eval task files over local data (benchmarks/lm_eval_tasks): fairlane_mc, 52
four-choice general-knowledge questions (loglikelihood), and fairlane_capitals, 24 capital cities
generated greedily up to a newline (generate_until). Without lm-eval, the requests lm-eval would
send (token ids of context + continuation, `echo`, `logprobs: 1`, `max_tokens: 0`) go through the
official openai client and are held to a direct fp32 forward of the model in this process.
The run fails (exit 1) when a loglikelihood differs by more than the tolerance or the accuracies
differ.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks import lm_eval_scoring as scoring
from benchmarks.common import add_common_args, done, machine, out_dir, tiny_model
from benchmarks.lm_eval_report import TOLERANCE, compare, plot, print_table, setup_fields
from benchmarks.round_trip import REPO, Served, serve

MODEL_NAME = "smollm2"
MC_TASK, GEN_TASK = "fairlane_mc", "fairlane_capitals"
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def smollm2_folder() -> Path:
    """SmolLM2 as the Hugging Face folder the engine converts its GGUF file into (once)."""
    from engine import assets
    from engine.loader import load_gguf

    source = assets.resolve_model(MODEL_NAME)
    folder = assets.converted_dir(source)
    return folder if (folder / "config.json").exists() else load_gguf(source).path


def serve_fp32(model: str, workdir: Path) -> Served:
    """`fairlane serve` for `model` in float32 with one engine thread, and a tenant of its own with a
    key, made through the admin API."""
    admin = "fl-admin-" + secrets.token_urlsafe(24)
    served = serve(
        model,
        workdir,
        timeout_s=300,
        env={
            "FAIRLANE_ENGINE__DTYPE": "float32",
            "FAIRLANE_ENGINE__NUM_THREADS": "1",
            "FAIRLANE_ADMIN_TOKEN": admin,
            "FAIRLANE_CONFIG": "",
        },
    )
    try:
        headers = {"Authorization": f"Bearer {admin}"}
        tenant = httpx.post(served.base_url + "/admin/tenants", json={"name": "lm-eval"}, headers=headers)
        tenant.raise_for_status()
        key = httpx.post(
            f"{served.base_url}/admin/tenants/{tenant.json()['id']}/keys",
            json={"name": "lm-eval"},
            headers=headers,
        )
        key.raise_for_status()
    except BaseException:
        served.stop()
        raise
    served.api_key = key.json()["key"]
    return served


# ---- with lm-eval ---------------------------------------------------------------------------


def run_lm_eval(python: str, model: str, model_args: str, out: Path, env: dict[str, str]) -> dict:
    """One `lm_eval` run of both tasks (from the repository root: the task files' paths are relative
    to it); its aggregated results and, per task, its logged samples by doc_id."""
    command = [
        python,
        "-m",
        "lm_eval",
        "--model",
        model,
        "--model_args",
        model_args,
        "--tasks",
        f"{MC_TASK},{GEN_TASK}",
        "--include_path",
        str(scoring.TASKS.relative_to(REPO)),
        "--batch_size",
        "1",
        "--log_samples",
        "--output_path",
        str(out),
    ]
    print("$", " ".join(command), flush=True)
    start = time.perf_counter()
    subprocess.run(command, cwd=REPO, env={**os.environ, **OFFLINE, **env}, check=True)
    seconds = time.perf_counter() - start
    results = json.loads(Path(sorted(glob.glob(f"{out}/**/results_*.json", recursive=True))[-1]).read_text())
    samples = {}
    for task in (MC_TASK, GEN_TASK):
        path = sorted(glob.glob(f"{out}/**/samples_{task}_*.jsonl", recursive=True))[-1]
        samples[task] = {s["doc_id"]: s for s in map(json.loads, Path(path).read_text().splitlines())}
    return {
        "results": results["results"],
        "samples": samples,
        "seconds": seconds,
        "command": " ".join(command[1:]),
    }


def lm_eval_side(run: dict) -> dict:
    """Per-request loglikelihoods, accuracies and generations of one lm-eval run."""
    mc, gen = run["samples"][MC_TASK], run["samples"][GEN_TASK]
    logliks = {(i, j): float(resp[0]) for i, s in mc.items() for j, resp in enumerate(s["filtered_resps"])}
    greedy = {(i, j): resp[1] == "True" for i, s in mc.items() for j, resp in enumerate(s["filtered_resps"])}
    res = run["results"]
    return {
        "logliks": logliks,
        "greedy": greedy,
        "accuracy": {"acc": res[MC_TASK]["acc,none"], "acc_norm": res[MC_TASK]["acc_norm,none"]},
        "generations": {i: s["resps"][0][0] for i, s in gen.items()},
        "exact_match": res[GEN_TASK]["exact_match,strip"],
        "seconds": run["seconds"],
        "command": run["command"],
    }


def with_lm_eval(args, folder: Path, workdir: Path) -> tuple[dict, dict, dict]:
    served = serve_fp32(MODEL_NAME, workdir)
    try:
        api = run_lm_eval(
            args.lm_eval_python,
            "local-completions",
            f"model={MODEL_NAME},base_url={served.base_url}/v1/completions,num_concurrent=1,"
            f"max_retries=1,tokenized_requests=True,tokenizer_backend=huggingface,tokenizer={folder}",
            workdir / "local-completions",
            {"OPENAI_API_KEY": served.api_key},
        )
    finally:
        served.stop()
    hf = run_lm_eval(
        args.lm_eval_python,
        "hf",
        f"pretrained={folder},dtype=float32",
        workdir / "hf",
        {"OMP_NUM_THREADS": "1"},
    )
    version = subprocess.run(
        [args.lm_eval_python, "-c", "import importlib.metadata as m; print(m.version('lm_eval'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    setup = {
        "fairlane": f"lm-eval {version} local-completions -> fairlane serve (fp32)",
        "reference": f"lm-eval {version} hf (fp32)",
    }
    return lm_eval_side(api), lm_eval_side(hf), setup


# ---- without lm-eval ------------------------------------------------------------------------


def without_lm_eval(
    spec: str, folder: str, workdir: Path, mc_items: int | None, gen_items: int | None
) -> tuple[dict, dict, dict]:
    """`spec` served by fairlane, `folder` (the same weights) loaded by transformers here."""
    import openai
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    mc_docs = scoring.read_jsonl(scoring.MC_FILE)[:mc_items]
    gen_docs = scoring.read_jsonl(scoring.GEN_FILE)[:gen_items]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    pairs = {
        (r.doc_id, r.choice): scoring.encode_pair(tokenizer, r.context, r.continuation)
        for r in scoring.mc_requests(mc_docs)
    }
    sides = {
        "fairlane": {"logliks": {}, "greedy": {}, "generations": {}},
        "reference": {"logliks": {}, "greedy": {}, "generations": {}},
    }
    served = serve_fp32(spec, workdir)
    try:
        client = openai.OpenAI(base_url=served.base_url + "/v1", api_key=served.api_key, max_retries=0)
        name = client.models.list().data[0].id
        start = time.perf_counter()
        for key, (ctx, cont) in pairs.items():
            ll, greedy = scoring.served_loglikelihood(client, name, ctx, cont)
            sides["fairlane"]["logliks"][key], sides["fairlane"]["greedy"][key] = ll, greedy
        for i, doc in enumerate(gen_docs):
            sides["fairlane"]["generations"][i] = scoring.served_generation(
                client, name, scoring.gen_prompt(doc)
            )
        sides["fairlane"]["seconds"] = time.perf_counter() - start
    finally:
        served.stop()
    start = time.perf_counter()
    for key, (ctx, cont) in pairs.items():
        sides["reference"]["logliks"][key], sides["reference"]["greedy"][key] = scoring.direct_loglikelihood(
            hf, ctx, cont
        )
    for i, doc in enumerate(gen_docs):
        sides["reference"]["generations"][i] = scoring.direct_generation(
            hf, tokenizer, scoring.gen_prompt(doc)
        )
    sides["reference"]["seconds"] = time.perf_counter() - start
    for side in sides.values():
        side["accuracy"] = scoring.mc_accuracy(mc_docs, side["logliks"])
        side["exact_match"] = sum(
            scoring.exact_match(side["generations"][i], d["capital"]) for i, d in enumerate(gen_docs)
        ) / len(gen_docs)
        side["command"] = None
    setup = {
        "fairlane": "openai client -> fairlane serve /v1/completions (fp32; echo, logprobs 1, max_tokens 0)",
        "reference": "transformers forward in this process (fp32)",
    }
    return sides["fairlane"], sides["reference"], setup


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--lm-eval-python",
        default=None,
        help="python of an environment with lm-eval 0.4 (README): run lm-eval's local-completions and hf",
    )
    ap.add_argument(
        "--replot", action="store_true", help="redraw lm_eval.png and the table from lm_eval.json"
    )
    add_common_args(ap)
    args = ap.parse_args()
    if args.smoke and args.lm_eval_python:
        ap.error("--smoke runs without lm-eval: leave out --lm-eval-python")
    out = out_dir(args, "lm_eval")
    name = "lm_eval" if args.lm_eval_python or args.replot else "lm_eval_openai_client"
    if args.replot:
        report = json.loads((out / f"{name}.json").read_text())
        print_table(report)
        plot(report, out / f"{name}.png")
        return
    with tempfile.TemporaryDirectory(prefix="fairlane-lm-eval-") as tmp:
        if args.smoke:
            model = tiny_model()
            fairlane, reference, setup = without_lm_eval(model, model, Path(tmp), mc_items=4, gen_items=2)
        elif args.lm_eval_python:
            model = str(smollm2_folder())
            fairlane, reference, setup = with_lm_eval(args, Path(model), Path(tmp))
        else:
            model = str(smollm2_folder())
            fairlane, reference, setup = without_lm_eval(
                MODEL_NAME, model, Path(tmp), mc_items=None, gen_items=None
            )
    mode = "lm-eval" if args.lm_eval_python else "openai-client"
    report = {
        "mode": mode,
        "model": Path(model).name,
        "dtype": "float32",
        "tolerance": TOLERANCE,
        "smoke": args.smoke,
        "machine": machine(),
        **setup_fields(setup, fairlane, reference),
        **compare(fairlane, reference),
    }
    (out / f"{name}.json").write_text(json.dumps(report, indent=2))
    print_table(report)
    plot(report, out / f"{name}.png")
    done(out)
    if not (report["loglikelihood"]["within_tolerance"] and report["accuracy"]["equal"]):
        sys.exit(1)


if __name__ == "__main__":
    main()
