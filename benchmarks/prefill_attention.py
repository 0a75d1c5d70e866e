"""bf16 prefill attention on the CPU: the cpu backend's C prefill kernel (engine/attention/csrc/
paged_prefill_bf16.h) against the SDPA path it replaces, side by side, at 1 and 2 threads:

- attention alone: one layer's attention of a fresh 2048-token prompt (one chunk) at SmolLM2's
  shape (9 query heads, 3 KV heads of 64, blocks of 16), its K/V writes included;
- the whole prefill step: the time to first token of a 2048-token prompt on SmolLM2 in bf16, one
  engine step (prefix caching off, a fresh random prompt each round).

    python -m benchmarks.prefill_attention            # SmolLM2, 1 and 2 threads
    python -m benchmarks.prefill_attention --smoke    # a tiny random model and short prompts, in seconds

"old" is the same backend with its prefill kernel switched off (chunks through SDPA). The two take
turns round after round, so a noisy machine slows them alike and their ratios hold; each time is
the median of its rounds, as wall time and as the process's CPU time. Writes prefill_attention.json
and prefill_attention.png under --out (benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable

import torch

from benchmarks.common import add_common_args, done, machine, out_dir, tiny_model
from engine import LLM, SamplingParams
from engine.attention import AttentionMetadata, PrefillChunk, make_backend
from engine.attention.cpu_paged import CPUPagedAttention

H, KVH, D, BS = 9, 3, 64, 16  # SmolLM2-135M's attention


def _timed(fn: Callable[[], object]) -> tuple[float, float]:
    """(wall, process CPU) seconds of one call."""
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


def _alternate(fns: dict[str, Callable[[], object]], rounds: int) -> dict[str, dict[str, float]]:
    """Median wall and CPU seconds of each function, called in turn `rounds` times (after one warm-up)."""
    for fn in fns.values():
        fn()
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(_timed(fn))
    return {
        name: {"wall_s": statistics.median(w for w, _ in t), "cpu_s": statistics.median(c for _, c in t)}
        for name, t in times.items()
    }


def _backend(kernel: bool) -> CPUPagedAttention:
    attn = make_backend("cpu", H, KVH, D)
    assert isinstance(attn, CPUPagedAttention)
    attn.prefill_kernel = attn.prefill_kernel and kernel
    return attn


def attention_alone(tokens: int, rounds: int) -> dict[str, dict[str, float]]:
    gen = torch.Generator().manual_seed(0)
    table = torch.randperm(tokens // BS + 4, generator=gen)[: -(-tokens // BS)]
    slots = (table[:, None] * BS + torch.arange(BS)).reshape(-1)[:tokens]
    meta = AttentionMetadata(slots, BS, 0, None, None, [PrefillChunk(0, tokens, tokens, table)])
    q, k, v = (torch.randn(tokens, h, D, generator=gen).bfloat16() for h in (H, KVH, KVH))
    old, new = _backend(False), _backend(True)
    cache = new.allocate_cache((len(table) + 4) * BS, torch.bfloat16)
    calls = {name: (lambda b=b: b.forward(q, k, v, cache, meta)) for name, b in (("old", old), ("new", new))}
    return _alternate(calls, rounds)


def _engine(model: str, threads: int, kernel: bool, tokens: int) -> LLM:
    llm = LLM(
        model=model,
        dtype="bfloat16",
        num_threads=threads,
        enable_prefix_caching=False,
        max_num_batched_tokens=tokens,
        attention_backend="cpu",
    )
    attn = llm.engine.runner.model.attention  # one backend, every layer's
    assert isinstance(attn, CPUPagedAttention)
    attn.prefill_kernel = attn.prefill_kernel and kernel
    return llm


def time_to_first_token(model: str, threads: int, tokens: int, rounds: int) -> dict[str, dict[str, float]]:
    old, new = _engine(model, threads, False, tokens), _engine(model, threads, True, tokens)
    gen = torch.Generator().manual_seed(threads)
    params = SamplingParams(max_tokens=1, temperature=0.0)
    prompts: list[list[int]] = []

    def run(llm: LLM) -> Callable[[], object]:
        def call() -> object:
            if llm is old:  # a fresh prompt each round, the same for both
                prompts.append(torch.randint(100, 40000, (tokens,), generator=gen).tolist())
            return llm.generate(prompts[-1], params)

        return call

    return _alternate({"old": run(old), "new": run(new)}, rounds)


def plot(result: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, part, title in zip(
        axes, ("attention", "ttft"), ("one layer's attention, 2048-token chunk", "TTFT, 2048-token prompt")
    ):
        rows = result[part]
        labels = [f"{t} thr" for t in rows]
        x = range(len(labels))
        for i, which in enumerate(("old", "new")):
            ax.bar([j + 0.4 * i for j in x], [rows[t][which]["wall_s"] for t in rows], 0.4, label=which)
        for j, t in enumerate(rows):
            ratio = f"x{rows[t]['ratio_wall']:.2f}"
            ax.text(j + 0.2, rows[t]["old"]["wall_s"], ratio, ha="center", va="bottom")
        ax.set_xticks([j + 0.2 for j in x], labels)
        ax.set_ylabel("seconds (median wall)")
        ax.set_title(title, fontsize=10)
        ax.legend()
    fig.suptitle("bf16 prefill attention: SDPA (old) vs the C kernel (new)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(parser)
    parser.add_argument("--rounds", type=int, default=5, help="rounds of attention alone")
    parser.add_argument("--ttft-rounds", type=int, default=3, help="rounds of the 2048-token prompt")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    kernel = _backend(True).prefill_kernel
    if not kernel and not args.smoke:
        raise SystemExit("this CPU has no AVX512-BF16: the bf16 prefill kernel does not run here")
    if not kernel:  # the smoke run still runs every line: both sides take the SDPA path
        print("this CPU has no AVX512-BF16: old and new both take the SDPA path", flush=True)
    model, tokens = ("smollm2", 2048) if not args.smoke else (tiny_model(), 64)
    rounds, ttft_rounds = (args.rounds, args.ttft_rounds) if not args.smoke else (2, 2)
    result: dict = {"machine": machine(), "tokens": tokens, "model": "smollm2" if not args.smoke else "tiny"}
    result["kernel"] = kernel
    result["rounds"] = {"attention": rounds, "ttft": ttft_rounds}
    result["loadavg_before"] = os.getloadavg()
    for part, fn in (
        ("attention", lambda t: attention_alone(tokens, rounds)),
        ("ttft", lambda t: time_to_first_token(model, t, tokens, ttft_rounds)),
    ):
        result[part] = {}
        for threads in args.threads:
            torch.set_num_threads(threads)
            r = fn(threads)
            r["ratio_wall"] = r["old"]["wall_s"] / r["new"]["wall_s"]
            r["ratio_cpu"] = r["old"]["cpu_s"] / r["new"]["cpu_s"]
            result[part][threads] = r
            print(part, threads, json.dumps(r), flush=True)
    result["loadavg_after"] = os.getloadavg()
    out = out_dir(args, "prefill_attention")
    (out / "prefill_attention.json").write_text(json.dumps(result, indent=1))
    plot(result, out / "prefill_attention.png")
    done(out)


if __name__ == "__main__":
    main()
