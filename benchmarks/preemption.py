"""Swap against recompute preemption on the real engine (SmolLM2 bf16, 2 threads).

    python -m benchmarks.preemption            # about 4 minutes on 2 CPU cores
    python -m benchmarks.preemption --smoke    # a tiny random model, two sizes, four requests

1. Cost per victim: for a sequence of N context tokens, the seconds to copy its KV blocks to host
   memory and back (SwapSpace.swap_out + swap_in) against the seconds to compute its N tokens again
   (one prefill forward of N fresh tokens: the worst case, nothing left in the prefix cache); next
   to them what "auto" estimates for each (engine-start copy measurement; prefill cost per token
   of the step-cost model after the runs). Medians of `--repeats` (one run above 512 tokens).
2. End to end: one KV-constrained workload (chat prompts, a cache of a few sequences) served with
   preemption_mode recompute, swap and auto (interleaved over `--rounds`; the best of each
   counts): output tokens per second and per CPU-second, preemptions, swaps, prefill tokens
   computed (recomputations included; the prompts alone are the same in every mode).
Times are wall and CPU seconds of this process: on a shared machine CPU time is the steadier.

Writes preemption.json and preemption.png under --out (benchmarks/results) and prints markdown tables.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch

from benchmarks.common import add_common_args, done, machine, out_dir, tiny_model
from benchmarks.workloads import chat_prompts, output_budgets
from engine import Engine, SamplingParams

ENGINE = {"model": "smollm2", "dtype": "bfloat16", "num_threads": 2, "block_size": 16}


def timed(fn) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of fn(). The machine is shared: CPU time is the
    steadier measure of work, wall time what a user waits."""
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


def cost_per_victim(sizes: list[int], repeats: int) -> dict:
    """Seconds to swap out + in, and to recompute, a sequence of N computed tokens."""
    eng = Engine(
        **ENGINE,
        max_num_batched_tokens=max(sizes),
        kv_cache_gib=0.25,
        enable_prefix_caching=False,
        preemption_mode="auto",
        incremental_text=False,
    )
    rng, swap, bs = random.Random(0), eng.runner.swap_space, eng.config.block_size
    eng.add_request("warm", [rng.randrange(100, 40000) for _ in range(64)], SamplingParams(max_tokens=1))
    while eng.has_unfinished():
        eng.step()
    rows = []
    for n in sizes:
        prefill, copies = [], []
        for r in range(repeats if n <= 512 else 1):
            eng.add_request(
                f"{n}-{r}",
                [rng.randrange(100, 40000) for _ in range(n)],
                SamplingParams(max_tokens=2, temperature=0, ignore_eos=True),
            )
            prefill.append(timed(eng.step))  # the whole prompt in one forward (the budget is max(sizes))
            seq = eng.seqs[f"{n}-{r}"]
            pairs = list(zip(seq.block_table[: -(-n // bs)], range(n)))  # the same host blocks each time
            copies.append(
                timed(lambda pairs=pairs: (swap.swap_out(pairs), swap.swap_in([(h, d) for d, h in pairs])))
            )
            eng.abort(seq.request_id)
        k = -(-n // bs)
        row = {
            "tokens": n,
            "blocks": k,
            "kv_bytes": k * swap.block_bytes,
            "estimated_swap_s": eng.swap_cost.fixed_s + k * eng.swap_cost.block_s,
        }
        for name, runs in (("recompute", prefill), ("swap", copies)):
            row[f"{name}_s"] = statistics.median(w for w, _ in runs)
            row[f"{name}_cpu_s"] = statistics.median(c for _, c in runs)
        rows.append(row)
    cost = eng.scheduler.preemption.cost
    per_token = cost.theta[1] or cost.prior[1]  # what "auto" uses
    for row in rows:
        row["estimated_recompute_s"] = row["tokens"] * per_token
        row["recompute_over_swap"] = row["recompute_s"] / row["swap_s"]
        row["recompute_over_swap_cpu"] = row["recompute_cpu_s"] / max(row["swap_cpu_s"], 1e-6)
    return {
        "rows": rows,
        "block_bytes": swap.block_bytes,
        "swap_cost_at_start": vars(eng.swap_cost),
        "fitted_prefill_token_s": per_token,
    }


def end_to_end(mode: str, n: int, kv_blocks: int, max_tokens: int) -> dict:
    eng = Engine(
        **ENGINE,
        num_kv_blocks=kv_blocks,
        max_num_seqs=16,
        max_num_batched_tokens=256,
        preemption_mode=mode,
        incremental_text=False,
    )
    prompts = chat_prompts(eng.tokenizer, n, max_len=512)
    budgets = output_budgets(n, low=min(16, max_tokens // 4), high=max_tokens)
    for i, (p, b) in enumerate(zip(prompts, budgets)):
        eng.add_request(str(i), p, SamplingParams(max_tokens=b, temperature=0, ignore_eos=True))

    def serve():
        while eng.has_unfinished():
            eng.step()

    wall, cpu = timed(serve)
    s = eng.stats
    return {
        "mode": mode,
        "seconds": wall,
        "cpu_seconds": cpu,
        "output_tokens": s.output_tokens,
        "tokens_per_s": s.output_tokens / wall,
        "tokens_per_cpu_s": s.output_tokens / cpu,
        "preemptions": s.preemptions,
        "swaps": s.swaps,
        "swapped_blocks": s.swapped_blocks,
        "swap_seconds": s.swap_seconds,
        "steps": s.steps,
        "prompt_tokens": sum(map(len, prompts)),
        # every token run through the model in a prefill chunk, recomputations included (prefix hits not)
        "prefill_tokens": s.prefill_tokens,
        "prefix_hit_tokens": eng.block_manager.num_prefix_hit_tokens,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="64,128,256,512,1024,2048")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--kv-blocks", type=int, default=40, help="KV blocks of 16 tokens in the end-to-end run")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--modes", default="recompute,swap,auto")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--replot", action="store_true", help="redraw the PNG and tables from the JSON")
    add_common_args(ap)
    args = ap.parse_args()
    out = out_dir(args, "preemption")
    if args.replot:
        report = json.loads((out / "preemption.json").read_text())
        e2e = report["end_to_end"]
        print_tables(report["cost_per_victim"], e2e["best"])
        plot(
            report["cost_per_victim"], e2e["best"], out / "preemption.png", e2e["requests"], e2e["kv_blocks"]
        )
        return
    if args.smoke:
        ENGINE.update(model=tiny_model(), dtype="float32")
        args.sizes, args.repeats, args.requests, args.max_tokens = "64,128", 1, 4, 16
    torch.set_num_threads(ENGINE["num_threads"])
    print("cost per victim ...", flush=True)
    costs = cost_per_victim([int(x) for x in args.sizes.split(",")], args.repeats)
    modes, every = args.modes.split(","), []
    for r in range(args.rounds):
        for mode in modes:
            print(f"end to end, round {r + 1}: {mode} ...", flush=True)
            every.append(end_to_end(mode, args.requests, args.kv_blocks, args.max_tokens))
    runs = [min((x for x in every if x["mode"] == m), key=lambda x: x["cpu_seconds"]) for m in modes]
    report = {
        **ENGINE,
        "smoke": args.smoke,
        "machine": machine(),
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cost_per_victim": costs,
        "end_to_end": {
            "requests": args.requests,
            "kv_blocks": args.kv_blocks,
            "max_tokens": args.max_tokens,
            "best": runs,
            "all": every,
        },
    }
    (out / "preemption.json").write_text(json.dumps(report, indent=2))
    print_tables(costs, runs)
    plot(costs, runs, out / "preemption.png", args.requests, args.kv_blocks)
    done(out)


def print_tables(costs: dict, runs: list[dict]) -> None:
    print(
        f"\nKV block: {costs['block_bytes'] / 2**10:.0f} KiB; measured at start: "
        f"{costs['swap_cost_at_start']}; "
        f"fitted prefill s/token: {costs['fitted_prefill_token_s']:.2e}"
    )
    print(
        "| tokens | KV MiB | recompute ms (CPU ms) | swap out + in ms (CPU ms) | recompute / swap (CPU) "
        "| auto's estimates ms |"
    )
    print("|---:|---:|---:|---:|---:|---|")
    for r in costs["rows"]:
        print(
            f"| {r['tokens']} | {r['kv_bytes'] / 2**20:.1f} | {r['recompute_s'] * 1e3:.0f} "
            f"({r['recompute_cpu_s'] * 1e3:.0f}) | {r['swap_s'] * 1e3:.1f} ({r['swap_cpu_s'] * 1e3:.1f}) | "
            f"{r['recompute_over_swap']:.0f}x ({r['recompute_over_swap_cpu']:.0f}x) | "
            f"{r['estimated_recompute_s'] * 1e3:.0f} vs {r['estimated_swap_s'] * 1e3:.1f} |"
        )
    print(
        "\n| mode | tok/s (per CPU-s) | seconds (CPU) | preemptions | swaps | prefill tokens computed "
        "| copy seconds |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in runs:
        print(
            f"| {r['mode']} | {r['tokens_per_s']:.1f} ({r['tokens_per_cpu_s']:.1f}) | {r['seconds']:.1f} "
            f"({r['cpu_seconds']:.1f}) | {r['preemptions']} | {r['swaps']} | {r['prefill_tokens']} "
            f"| {r['swap_seconds']:.3f} |"
        )


def plot(costs: dict, runs: list[dict], path: Path, n: int, kv_blocks: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    xs = [r["tokens"] for r in costs["rows"]]
    a.loglog(
        xs, [r["recompute_s"] * 1e3 for r in costs["rows"]], "o-", color="#e63", label="recompute (prefill)"
    )
    a.loglog(xs, [r["swap_s"] * 1e3 for r in costs["rows"]], "o-", color="#69c", label="swap out + in")
    a.loglog(
        xs,
        [r["estimated_recompute_s"] * 1e3 for r in costs["rows"]],
        ":",
        color="#e63",
        label="auto's estimate",
    )
    a.loglog(
        xs, [r["estimated_swap_s"] * 1e3 for r in costs["rows"]], ":", color="#69c", label="auto's estimate"
    )
    a.set_xlabel("context tokens of the victim")
    a.set_ylabel("ms")
    a.set_title("cost per preempted sequence (CPU)")
    a.legend(fontsize=8)
    bars = b.bar(
        [r["mode"] for r in runs], [r["prefill_tokens"] for r in runs], color=["#e63", "#69c", "#999"]
    )
    b.bar_label(
        bars,
        labels=[
            f"{r['prefill_tokens']}\n{r['preemptions']} preempt., {r['swaps']} swaps\n"
            f"{r['tokens_per_s']:.1f} tok/s\n{r['tokens_per_cpu_s']:.1f} tok/CPU-s"
            for r in runs
        ],
        fontsize=8,
    )
    b.margins(y=0.35)
    b.set_ylabel("prefill tokens computed (recomputation included)")
    b.set_title(f"{n} chat requests, KV cache of {kv_blocks} blocks")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
