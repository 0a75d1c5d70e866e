"""One stream at a time: milliseconds per output token at batch 1 (decode steps after the first
token), for fairlane in fp32, bf16 and with INT8 weights, Hugging Face `generate` and, from their own
Python environments, vLLM and llama.cpp; each against the memory-bandwidth bound of its weight
bytes (a batch-1 decode step reads every weight once).

    python -m benchmarks.decode_latency                       # SmolLM2, 2 threads, 128 tokens
    python -m benchmarks.decode_latency --vllm-python VENV/bin/python \\
        --llamacpp-python VENV2/bin/python --gguf F32.gguf --gguf Q4_1.gguf
    python -m benchmarks.decode_latency --family qwen3        # random weights, Qwen3-0.6B's shape
    python -m benchmarks.decode_latency --smoke               # a tiny random model, in seconds

The bound: weight bytes / the machine's read bandwidth (benchmarks/bandwidth.py: a vectorised C
read over a 1 GiB buffer, best of several passes with up to the same threads), measured before and
after the systems in the same run, the better of the two counting. `--family` measures another
family at a real model's shape (benchmarks/common.py FAMILY_SHAPES) instead of SmolLM2. Each
system is loaded, measured and released in turn (one model in memory at a time). Writes
decode_latency.json and decode_latency.png (decode_latency_<family>.* with --family) under --out
(benchmarks/results).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.bandwidth import read_bandwidth
from benchmarks.common import (
    FAMILY_SHAPES,
    add_common_args,
    done,
    family_model,
    machine,
    out_dir,
    result_line,
    tiny_model,
)
from benchmarks.throughput import run_vllm
from engine import LLM, SamplingParams
from engine.device import resolve_dtype

PROMPT = [{"role": "user", "content": "Write a short story about a lighthouse keeper and a storm."}]
LLAMACPP_RUNNER = Path(__file__).parent / "external" / "llamacpp_runner.py"


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def weight_bytes(llm: LLM) -> int:
    """Bytes a batch-1 decode step reads: every projection and the LM head (int8 or dense), the norms."""
    model = llm.engine.runner.model
    total = model.norm.numel() * model.norm.element_size()
    for layer in model.layers:
        total += sum(t.numel() * t.element_size() for t in (layer.input_norm, layer.post_norm))
        total += sum(_linear_bytes(lin) for lin in (layer.qkv, layer.o, layer.gate_up, layer.down))
    return total + _linear_bytes(model.lm_head)


def _linear_bytes(linear) -> int:
    if hasattr(linear, "nbytes"):
        return linear.nbytes
    return linear.weight.numel() * linear.weight.element_size()


def fairlane_ms_per_token(llm: LLM, tokens: int) -> dict:
    """Steps after the first token of one request, timed one by one: their mean (the measure every
    system is compared by: time after the first token over the tokens after it) and median, in ms."""
    engine = llm.engine
    ids = llm.encode(PROMPT)
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    llm.generate([ids], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))  # warm-up
    engine.add_request("latency", ids, params)
    steps = []
    while engine.has_unfinished():
        t = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - t)
    decode = steps[1:]  # the first step is the prefill (and the first token)
    return {
        "ms_per_token": 1000 * statistics.fmean(decode),
        "median_ms": 1000 * statistics.median(decode),
        "tokens": len(steps),
    }


def hf_ms_per_token(model, ids: list[int], tokens: int) -> dict:
    x = torch.tensor([ids])
    kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None)
    model.generate(x, max_new_tokens=4, min_new_tokens=4, **kw)  # warm-up
    first = _timed(lambda: model.generate(x, max_new_tokens=1, min_new_tokens=1, **kw))
    total = _timed(lambda: model.generate(x, max_new_tokens=tokens, min_new_tokens=tokens, **kw))
    return {"ms_per_token": 1000 * (total - first) / (tokens - 1), "tokens": tokens}


def llamacpp_ms_per_token(python: str, gguf: str, ids: list[int], tokens: int, threads: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "job.json"
        job.write_text(json.dumps({"gguf": gguf, "prompt": ids, "tokens": tokens, "threads": threads}))
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        run = subprocess.run(
            [python, str(LLAMACPP_RUNNER), str(job)], capture_output=True, text=True, env=env, timeout=1800
        )
    if run.returncode != 0:
        raise RuntimeError(f"llama.cpp failed: {run.stderr[-3000:]}")
    return result_line(run.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--vllm-python", default=None)
    ap.add_argument(
        "--vllm-dtypes",
        default=None,
        help="comma-separated dtypes vLLM runs at (default: float32, and bfloat16 where `auto` picks it)",
    )
    ap.add_argument("--llamacpp-python", default=None)
    ap.add_argument("--gguf", action="append", default=[], help="a GGUF file for llama.cpp (repeatable)")
    ap.add_argument(
        "--family",
        choices=sorted(FAMILY_SHAPES),
        default=None,
        help="measure this family at a real model's shape (random weights) instead of SmolLM2",
    )
    ap.add_argument(
        "--systems",
        default="fairlane,fairlane_bf16,fairlane_int8",
        help="the fairlane configurations to run, comma-separated (HF always runs: the reference)",
    )
    add_common_args(ap)
    args = ap.parse_args()
    out = out_dir(args, "decode_latency")
    if args.family:
        model = family_model(args.family, smoke=args.smoke)
    else:
        model = tiny_model() if args.smoke else "smollm2"
    tokens = 16 if args.smoke else args.tokens
    torch.set_num_threads(args.threads)
    bandwidth = read_bandwidth(args.threads, gib=0.25 if args.smoke else 1.0)
    runs: dict = {}
    systems = {
        "fairlane": dict(dtype="float32"),
        "fairlane_bf16": dict(dtype="bfloat16"),
        "fairlane_int8": dict(dtype="float32", quantization="int8"),
    }
    chosen = ["fairlane", *(s for s in args.systems.split(",") if s != "fairlane")]  # fp32: the reference
    if unknown := set(chosen) - set(systems):
        raise SystemExit(f"unknown system(s) {sorted(unknown)}; known: {sorted(systems)}")
    for name in chosen:
        options = systems[name]
        print(f"{name} ...", flush=True)
        # one stream needs a few blocks: a small cache keeps a real-size family's run in memory
        llm = LLM(model=model, num_threads=args.threads, kv_cache_gib=0.125, **options)
        runs[name] = {**fairlane_ms_per_token(llm, tokens), "weight_bytes": weight_bytes(llm)}
        if name == "fairlane":
            ids, model_path, model_name = llm.encode(PROMPT), llm.engine.model_path, llm.engine.model_name
        del llm
        gc.collect()
    dense_bytes = runs["fairlane"]["weight_bytes"]
    from transformers import AutoModelForCausalLM

    print("hf ...", flush=True)
    hf = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    runs["hf"] = {**hf_ms_per_token(hf, ids, tokens), "weight_bytes": dense_bytes}
    del hf
    gc.collect()
    # vLLM in float32 and, where fairlane's `auto` picks bfloat16 (native bf16 on this CPU), in bfloat16
    vllm_dtypes = (
        args.vllm_dtypes.split(",")
        if args.vllm_dtypes
        else sorted({"float32", str(resolve_dtype("auto")).removeprefix("torch.")})
    )
    for dtype in vllm_dtypes if args.vllm_python else []:
        name = "vllm" if dtype == "float32" else f"vllm_{'bf16' if dtype == 'bfloat16' else dtype}"
        print(f"{name} ...", flush=True)
        r = run_vllm(args.vllm_python, model_path, [ids], [tokens], True, dtype, args.threads, mode="latency")
        half = runs.get("fairlane_bf16", {}).get("weight_bytes", dense_bytes // 2)
        runs[name] = {**r, "weight_bytes": dense_bytes if dtype == "float32" else half}
    for gguf in args.gguf:
        if not args.llamacpp_python:
            raise SystemExit("--gguf needs --llamacpp-python")
        name = f"llama.cpp {Path(gguf).name}"
        print(f"{name} ...", flush=True)
        runs[name] = {
            **llamacpp_ms_per_token(args.llamacpp_python, gguf, ids, tokens, args.threads),
            "weight_bytes": os.path.getsize(gguf),
        }
    bandwidth = max(bandwidth, read_bandwidth(args.threads, gib=0.25 if args.smoke else 1.0))
    for r in runs.values():
        r["bound_ms"] = 1000 * r["weight_bytes"] / bandwidth
        r["fraction_of_bound"] = r["bound_ms"] / r["ms_per_token"]
    report = {
        "model": model_name,
        "family": args.family or "llama",
        "shape": FAMILY_SHAPES[args.family] if args.family and not args.smoke else None,
        "smoke": args.smoke,
        "threads": args.threads,
        "tokens": tokens,
        "read_bandwidth_gb_s": bandwidth / 1e9,
        "machine": machine(),
        "torch": torch.__version__,
        "runs": runs,
    }
    stem = f"decode_latency_{args.family}" if args.family else "decode_latency"
    (out / f"{stem}.json").write_text(json.dumps(report, indent=2))
    print("\n| system | ms/token | weight MB | bound ms/token | fraction of bound |")
    print("|---|---:|---:|---:|---:|")
    for name, r in runs.items():
        print(
            f"| {name} | {r['ms_per_token']:.1f} | {r['weight_bytes'] / 1e6:.0f} | {r['bound_ms']:.1f} | "
            f"{r['fraction_of_bound']:.2f} |"
        )
    print(f"read bandwidth: {bandwidth / 1e9:.1f} GB/s")
    plot(runs, out / f"{stem}.png", f"{report['model']}, batch 1, {args.threads} threads")
    done(out)


def plot(runs: dict, path: Path, what: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.6 * len(runs) + 3, 4))
    names = list(runs)
    bars = ax.bar(names, [runs[k]["ms_per_token"] for k in names], color="#e63", label="measured")
    ax.bar_label(bars, fmt="%.1f")
    ax.scatter(
        names,
        [runs[k]["bound_ms"] for k in names],
        color="k",
        marker="_",
        s=600,
        zorder=3,
        label="memory-bandwidth bound",
    )
    ax.set(ylabel="ms per output token", title=what)
    ax.tick_params(axis="x", labelrotation=20)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
