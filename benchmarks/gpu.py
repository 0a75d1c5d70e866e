"""fairlane on a GPU against the memory-bandwidth bound and transformers, in one run on one device.

    python3 -m benchmarks.gpu                      # 1B and 8B shapes, every part, within 10 minutes
    python3 -m benchmarks.gpu --models 1b --parts workload --hf-requests 256 --budget-s 0
    python3 -m benchmarks.gpu --smoke              # CPU, tiny shape, seconds (--dry-run: the real grid)

Needs only torch, triton, transformers and safetensors (no model files, no network): random
weights at real shapes in bf16, token-id prompts. Parts: `bandwidth` (a device-to-device copy,
bytes read + written), `decode` (fairlane's decode step at batch 1/8/32/64/128 x context
512/4096, against (weights + KV bytes) / bandwidth), `workload` (256 requests, prompts 24-1000,
outputs 16-768, ignore_eos: fairlane, HF static batches of 64 and transformers' continuous
batching on the first --hf-requests) and `hf_decode` (HF batch-1 decode with a static cache).
fairlane's parts run for every shape first, then the baselines; no part starts after --budget-s
seconds (default 480, so the default run ends within 10 minutes; what it skipped is recorded as
skipped). Writes gpu.json after every part (and gpu.png when matplotlib is there) under
benchmarks/results/ or --out. docs/gpu.md reads them.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.gpu_hf import free, left, run_hf, sync
from engine import LLM, SamplingParams

RESULTS = Path(__file__).parent / "results"
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
SHAPES = {  # LlamaConfig kwargs of each model's published config.json
    "135m": dict(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        tie_word_embeddings=True,
        rope_theta=100000.0,
        max_position_embeddings=8192,
    ),
    "1b": dict(
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        tie_word_embeddings=True,
        rope_theta=500000.0,
        rope_scaling=LLAMA3_ROPE,
        max_position_embeddings=131072,
    ),
    "8b": dict(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=False,
        rope_theta=500000.0,
        max_position_embeddings=8192,
    ),
    "tiny": dict(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        tie_word_embeddings=True,
        max_position_embeddings=2048,
    ),
}
NAMES = {"135m": "SmolLM2-135M shape", "1b": "Llama-3.2-1B shape", "8b": "Llama-3-8B shape", "tiny": "tiny"}
MAX_MODEL_LEN = 8192
MAX_BATCHED_TOKENS = 8192  # the engine's prefill budget a step
DRY_RUN_SCALE = 32  # --dry-run divides contexts and the prefill budget by this (every ratio kept)
BUDGET_S = 480.0  # the default run's parts start within 8 minutes, so it ends within 10 on an H100


def workload(n: int, vocab: int, seed: int = 0, prompts=(24, 1000), outputs=(16, 768)):
    """n long-tailed requests: log-uniform prompt and output lengths in the given ranges."""
    rng = random.Random(seed)

    def log_uniform(lo: int, hi: int) -> int:
        return int(round(lo * (hi / lo) ** rng.random()))

    ids = [[rng.randrange(2, vocab) for _ in range(log_uniform(*prompts))] for _ in range(n)]
    return ids, [log_uniform(*outputs) for _ in range(n)]


def copy_bandwidth(device: torch.device, nbytes: int, repeats: int = 20) -> float:
    """Bytes read + written per second by a device-to-device copy (median of `repeats`)."""
    src = torch.randn(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    times = []
    for i in range(repeats + 3):
        sync(device)
        t = time.perf_counter()
        dst.copy_(src)
        sync(device)
        if i >= 3:
            times.append(time.perf_counter() - t)
    return 2 * nbytes / statistics.median(times)


def sizes(shape: dict, dtype: torch.dtype) -> tuple[int, int]:
    """(weight bytes, KV bytes per token) of a Llama shape."""
    h, v, inter, layers = (
        shape["hidden_size"],
        shape["vocab_size"],
        shape["intermediate_size"],
        shape["num_hidden_layers"],
    )
    hd, heads, kvh = shape["head_dim"], shape["num_attention_heads"], shape["num_key_value_heads"]
    per_layer = h * hd * (2 * heads + 2 * kvh) + 3 * h * inter + 2 * h
    params = layers * per_layer + v * h * (1 if shape["tie_word_embeddings"] else 2) + h
    return params * dtype.itemsize, layers * 2 * kvh * hd * dtype.itemsize


def make_llm(shape: dict, device, dtype: torch.dtype, kv_gib: float, max_seqs: int, max_batched: int) -> LLM:
    return LLM(
        model="dummy",
        dummy_config=shape,
        device=str(device),
        dtype=str(dtype).removeprefix("torch."),
        kv_cache_gib=kv_gib,
        max_num_seqs=max_seqs,
        max_num_batched_tokens=max_batched,
        max_model_len=min(MAX_MODEL_LEN, shape["max_position_embeddings"]),
        swap_space_gib=1.0,
    )


def decode_tokens(batch: int, context: int, steps: int, max_batched_tokens: int) -> int:
    """Tokens a request asks for so that `steps` steps see every sequence decoding: the first
    requests decode through the batch x context / (budget - batch) prefill steps (chunked prefill;
    decodes share the budget), so they must outlast the last one's prefill."""
    assert max_batched_tokens > batch, "the prefill budget must exceed the batch"
    prefill_steps = -(-batch * context // (max_batched_tokens - batch)) + 1
    return steps + prefill_steps + 4


def decode_step_ms(
    llm: LLM, batch: int, context: int, steps: int, vocab: int, max_batched_tokens: int = MAX_BATCHED_TOKENS
) -> float:
    """Median wall time of an engine step (schedule, forward, sample, outputs) while `batch`
    sequences of `context` tokens all decode; prefill steps are not counted."""
    eng, rng = llm.engine, random.Random(batch * 7919 + context)
    max_tokens = decode_tokens(batch, context, steps, max_batched_tokens)
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    for i in range(batch):
        eng.add_request(f"d{batch}-{context}-{i}", [rng.randrange(2, vocab) for _ in range(context)], params)
    times = []
    while eng.has_unfinished():
        decoding = eng.num_running == batch and all(s.num_output_tokens > 0 for s in eng.seqs.values())
        t = time.perf_counter()
        eng.step()
        if decoding:
            times.append(time.perf_counter() - t)
        if len(times) == steps + 2:  # the rest of the budget is slack
            for i in range(batch):
                eng.abort(f"d{batch}-{context}-{i}")
    if not times:
        raise RuntimeError(f"batch {batch} x context {context}: no step had every sequence decoding")
    return statistics.median(times[2:] or times) * 1e3


def fairlane_workload(llm: LLM, prompts, budgets) -> dict:
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in budgets]
    llm.generate(prompts[:2], params[:2])  # warm-up: kernel compilation
    t = time.perf_counter()
    out = llm.generate(prompts, params)
    seconds = time.perf_counter() - t
    tokens = sum(len(c.token_ids) for c in out)
    return {
        "requests": len(prompts),
        "seconds": seconds,
        "output_tokens": tokens,
        "tokens_per_s": tokens / seconds,
    }


def run_model(
    key: str, args, device: torch.device, dtype: torch.dtype, bandwidth: float, res: dict, save
) -> None:
    """Fill `res` with one model shape's measurements, saving after each."""
    shape = SHAPES[key]
    weight_bytes, kv_per_token = sizes(shape, dtype)
    res.update(
        name=NAMES[key],
        shape=shape,
        weight_bytes=weight_bytes,
        kv_bytes_per_token=kv_per_token,
        bound_batch1_ms=weight_bytes / bandwidth * 1e3,
        decode=[],
        workload={},
    )
    save()
    prompts, budgets = workload(
        args.requests, shape["vocab_size"], prompts=args.prompt_range, outputs=args.output_range
    )
    if args.parts & {"decode", "workload"}:
        run_fairlane(res, args, shape, device, dtype, bandwidth, prompts, budgets, save)


def run_fairlane(
    res: dict, args, shape: dict, device, dtype, bandwidth: float, prompts, budgets, save
) -> None:
    """fairlane's decode steps against their bound, then the workload; the engine is freed after."""
    weight_bytes, kv_per_token = res["weight_bytes"], res["kv_bytes_per_token"]
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        kv_gib = (total * 0.9 - 1.6 * weight_bytes - 6 * 2**30) / 2**30  # load peak, activations, graphs
    else:
        kv_gib = 0.25
    max_seqs = max(max(args.batches), 256 if "workload" in args.parts else 0)
    llm = make_llm(shape, device, dtype, kv_gib, max_seqs, args.max_batched_tokens)
    capacity = llm.engine.num_total_blocks * llm.engine.config.block_size
    llm.generate([[2] * 16] * 2, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))  # warm-up
    if "decode" in args.parts:
        for context in args.contexts:
            for batch in args.batches:
                row = {"batch": batch, "context": context}
                need = batch * (
                    context + decode_tokens(batch, context, args.steps, args.max_batched_tokens) + 4
                )
                if need > capacity:
                    row["skipped"] = f"KV for {need} tokens > cache of {capacity} on this device"
                elif left(args.deadline) <= 0:
                    row["skipped"] = "time budget spent (--budget-s)"
                else:
                    ms = decode_step_ms(
                        llm, batch, context, args.steps, shape["vocab_size"], args.max_batched_tokens
                    )
                    bound = (weight_bytes + batch * context * kv_per_token) / bandwidth * 1e3
                    row.update(
                        step_ms=ms,
                        bound_ms=bound,
                        fraction_of_bound=bound / ms,
                        tokens_per_s=batch / ms * 1e3,
                    )
                res["decode"].append(row)
                save()
    if "workload" in args.parts:
        if left(args.deadline) <= 0:
            res["workload"]["fairlane"] = {"skipped": "time budget spent (--budget-s)"}
        else:
            res["workload"]["fairlane"] = fairlane_workload(llm, prompts, budgets)
        save()
    del llm
    free()


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shape, a handful of requests, a temp dir")
    ap.add_argument("--dry-run", action="store_true", help="--smoke with the real decode grid, scaled")
    ap.add_argument(
        "--out", type=Path, help="results folder (default benchmarks/results; a temp dir with --smoke)"
    )
    ap.add_argument("--models", default="1b,8b", help=f"comma-separated: {','.join(SHAPES)}")
    ap.add_argument("--parts", default="bandwidth,decode,workload,hf_decode")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--hf-requests", type=int, default=64, help="HF baselines run the first N requests")
    ap.add_argument("--hf-batch", type=int, default=64)
    ap.add_argument("--hf-decode-tokens", type=int, default=256)
    ap.add_argument("--batches", default="1,8,32,64,128")
    ap.add_argument("--contexts", default="512,4096")
    ap.add_argument("--steps", type=int, default=32, help="decode steps timed per (batch, context)")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help=f"no part starts after this many seconds, recorded as skipped (0: no limit; default "
        f"{BUDGET_S:.0f}, none with --smoke or --dry-run)",
    )
    args = ap.parse_args(argv)
    if args.budget_s is None:
        args.budget_s = 0.0 if args.smoke or args.dry_run else BUDGET_S
    args.deadline = time.monotonic() + args.budget_s if args.budget_s > 0 else math.inf
    args.prompt_range, args.output_range = (24, 1000), (16, 768)
    args.max_batched_tokens = MAX_BATCHED_TOKENS
    real_grid = (args.batches, args.contexts, args.steps)
    if args.smoke or args.dry_run:
        args.device, args.dtype, args.models = "cpu", "float32", "tiny"
        args.requests, args.hf_requests, args.hf_batch, args.hf_decode_tokens = 6, 6, 4, 16
        args.batches, args.contexts, args.steps = "1,4", "32,64", 4
        args.prompt_range, args.output_range = (8, 40), (4, 16)
        args.out = args.out or Path(tempfile.mkdtemp(prefix="fairlane-gpu-smoke-"))
    if args.dry_run:  # the decode grid of a real run, every ratio kept (prefill steps, budgets, batches)
        args.batches, contexts, args.steps = real_grid
        args.contexts = ",".join(str(max(1, int(c) // DRY_RUN_SCALE)) for c in contexts.split(","))
        args.max_batched_tokens = MAX_BATCHED_TOKENS // DRY_RUN_SCALE
    args.out = args.out or RESULTS
    args.parts = set(args.parts.split(","))
    args.batches = [int(b) for b in args.batches.split(",")]
    args.contexts = [int(c) for c in args.contexts.split(",")]
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    from engine.device import resolve_device

    device = resolve_device(args.device)
    dtype = getattr(torch, args.dtype)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    results = {
        "device": name,
        "date": time.strftime("%Y-%m-%d"),
        "torch": torch.__version__,
        "smoke": args.smoke,
        "dtype": args.dtype,
        "models": {},
    }
    try:
        import transformers
        import triton

        results["transformers"], results["triton"] = transformers.__version__, triton.__version__
    except ImportError:
        pass
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "gpu.json"

    def save():
        path.write_text(json.dumps(results, indent=2))

    nbytes = 2**30 if device.type == "cuda" else 2**26
    results["copy_bandwidth_Bps"] = copy_bandwidth(device, nbytes)
    save()
    bandwidth, keys = results["copy_bandwidth_Bps"], args.models.split(",")
    for key in keys:  # fairlane on every shape first, then the slower baselines
        results["models"][key] = {}
        run_model(key, args, device, dtype, bandwidth, results["models"][key], save)
    for key in keys if args.parts & {"workload", "hf_decode"} else ():
        res, shape = results["models"][key], SHAPES[key]
        prompts, budgets = workload(
            args.requests, shape["vocab_size"], prompts=args.prompt_range, outputs=args.output_range
        )
        run_hf(res, args, shape, device, dtype, bandwidth, prompts, budgets, save)
        free()  # the HF model went with run_hf's frame
    from benchmarks.gpu_report import plot, table

    print(table(results))
    plot(results, args.out / "gpu.png")
    print(f"wrote {path}")
    print(f"results: {args.out}")  # the last line of every benchmark (benchmarks/common.py `done`)
    return results


if __name__ == "__main__":
    main()
