"""The Hugging Face baselines of benchmarks/gpu.py, on the same device and workload: `generate`
with static padded batches, transformers' continuous batching, and batch-1 decode with a static
cache (which transformers compiles on a GPU). Random weights at the model's shape."""

from __future__ import annotations

import gc
import math
import time

import torch


def build_hf(config, dtype: torch.dtype, device: torch.device, seed: int = 0):
    """A LlamaForCausalLM with random weights, built directly on `device` in `dtype`."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM._from_config(config, dtype=dtype)
    return model.eval()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def left(deadline: float) -> float:
    """Seconds left before `deadline` (time.monotonic(); math.inf: no time budget)."""
    return deadline - time.monotonic()


@torch.inference_mode()
def hf_static(
    model, prompts: list[list[int]], budgets: list[int], batch_size: int, deadline: float = math.inf
) -> dict:
    """Batches in arrival order, left-padded; each runs to its longest budget (ignore_eos). Only the
    tokens each request asked for count as output. No batch starts after `deadline`: the result
    covers the requests of the batches that ran (the first ones in arrival order)."""
    device = model.device
    useful, done = 0, 0
    sync(device)
    t = time.perf_counter()
    for s in range(0, len(prompts), batch_size):
        batch, caps = prompts[s : s + batch_size], budgets[s : s + batch_size]
        width = max(map(len, batch))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in batch], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=device)
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max(caps),
            min_new_tokens=max(caps),
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
        useful += sum(min(cap, out.shape[1] - width) for cap in caps)
        done += len(batch)
        if left(deadline) <= 0:
            break
    sync(device)
    seconds = time.perf_counter() - t
    return {
        "requests": done,
        "batch_size": batch_size,
        "seconds": seconds,
        "output_tokens": useful,
        "tokens_per_s": useful / seconds,
    }


def hf_continuous(
    model,
    prompts: list[list[int]],
    budgets: list[int],
    num_blocks: int | None = None,
    deadline: float = math.inf,
) -> dict:
    """transformers' continuous batching manager (what `generate_batch` drives), per-request budgets.
    Not under inference_mode: the manager's thread updates its own tensors in place. Its KV cache
    takes most free memory unless `num_blocks` caps it (the CPU smoke run: filling it costs seconds).
    Past `deadline` it stops and raises TimeoutError (a partial run's rate would favour short
    requests)."""
    from transformers import GenerationConfig

    cfg = GenerationConfig(max_new_tokens=max(budgets), do_sample=False, eos_token_id=-1, pad_token_id=0)
    kw = {}
    if num_blocks is not None:
        try:
            from transformers import ContinuousBatchingConfig

            kw["continuous_batching_config"] = ContinuousBatchingConfig(num_blocks=num_blocks)
        except ImportError:  # older transformers: the cache size is a generation setting
            cfg.num_blocks = num_blocks
    sync(model.device)
    t = time.perf_counter()
    with model.continuous_batching_context_manager(
        generation_config=cfg, block=True, timeout=5, **kw
    ) as manager:
        for i, (p, n) in enumerate(zip(prompts, budgets)):
            manager.add_request(p, request_id=f"r{i}", max_new_tokens=n, eos_token_id=[-1])
        results = {}
        while len(results) < len(prompts):
            r = manager.get_result(timeout=1)
            if r is not None and r.is_finished():
                results[r.request_id] = r
            if left(deadline) <= 0:
                raise TimeoutError(
                    f"over the time budget: {len(results)} of {len(prompts)} requests finished"
                )
    seconds = time.perf_counter() - t
    useful = sum(min(n, len(results[f"r{i}"].generated_tokens)) for i, n in enumerate(budgets))
    if useful < sum(budgets):
        raise RuntimeError(f"transformers' continuous batching produced {useful} of {sum(budgets)} tokens")
    return {
        "requests": len(prompts),
        "seconds": seconds,
        "output_tokens": useful,
        "tokens_per_s": useful / seconds,
    }


@torch.inference_mode()
def hf_decode_batch1(model, prompt_len: int, new_tokens: int, vocab: int) -> dict:
    """Batch-1 greedy decode with a static cache: seconds per token from the difference of two runs
    (long minus short, so the prefill and the first step cancel), after a warm-up that compiles."""
    device = model.device
    ids = torch.randint(2, vocab, (1, prompt_len), generator=torch.Generator().manual_seed(1)).to(device)

    def run(n: int) -> float:
        sync(device)
        t = time.perf_counter()
        model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
            cache_implementation="static",
        )
        sync(device)
        return time.perf_counter() - t

    short = max(2, new_tokens // 8)
    run(new_tokens)  # warm-up: transformers compiles the decode step here on a GPU
    run(short)
    long_s, short_s = min(run(new_tokens) for _ in range(2)), min(run(short) for _ in range(2))
    per_token = max(long_s - short_s, 1e-9) / (new_tokens - short)
    return {"prompt_tokens": prompt_len, "step_ms": per_token * 1e3, "tokens_per_s": 1 / per_token}


HF_DECODE_SECONDS = 120.0  # what hf_decode needs at least (transformers compiles its decode step first)


def run_hf(res: dict, args, shape: dict, device, dtype, bandwidth: float, prompts, budgets, save) -> None:
    """The HF baselines on a model of the same shape (random weights), each skipped once the run's
    time budget (args.deadline) is spent."""
    from transformers import LlamaConfig

    if left(args.deadline) <= 0:
        for key in ("hf_static", "hf_continuous") if "workload" in args.parts else ():
            res["workload"][key] = {"skipped": "time budget spent (--budget-s)"}
        if "hf_decode" in args.parts:
            res["hf_batch1_static_cache"] = {"skipped": "time budget spent (--budget-s)"}
        save()
        return
    hf = build_hf(LlamaConfig(**shape), dtype, device)
    n = min(args.hf_requests, len(prompts))
    if "workload" in args.parts:
        w = res["workload"]
        baseline(
            w,
            "hf_static",
            args,
            lambda: hf_static(hf, prompts[:n], budgets[:n], args.hf_batch, args.deadline),
        )
        save()
        n = w["hf_static"].get("requests", n)  # the same requests as the static batches ran
        blocks = 64 if args.smoke else None
        baseline(
            w,
            "hf_continuous",
            args,
            lambda: hf_continuous(hf, prompts[:n], budgets[:n], num_blocks=blocks, deadline=args.deadline),
        )
        save()
    if "hf_decode" in args.parts:
        context = args.contexts[0]

        def batch1() -> dict:
            r = hf_decode_batch1(hf, context, args.hf_decode_tokens, shape["vocab_size"])
            bound = (res["weight_bytes"] + context * res["kv_bytes_per_token"]) / bandwidth * 1e3
            return {**r, "bound_ms": bound, "fraction_of_bound": bound / r["step_ms"]}

        if left(args.deadline) < HF_DECODE_SECONDS and not args.smoke:
            res["hf_batch1_static_cache"] = {"skipped": "time budget spent (--budget-s)"}
        else:
            baseline(res, "hf_batch1_static_cache", args, batch1)
        save()


def baseline(into: dict, key: str, args, measure) -> None:
    """A baseline's result, or on a GPU run the error that stopped it (the run goes on to the
    next part; the smoke run, a test, fails)."""
    try:
        into[key] = measure()
    except Exception as exc:  # noqa: BLE001 - recorded in the results, not hidden
        if args.smoke:
            raise
        into[key] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        free()
