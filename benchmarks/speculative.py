"""Speculative decoding with prompt-lookup (n-gram) drafts: batch-1 milliseconds per output token
with and without it, greedy, on a copy-heavy workload (prompts that repeat or edit a given text)
and on free chat, in each dtype; the share of drafted tokens kept, the steps each engine took, the
verifications by draft length and the drafts' own cost; and at
batch 32 with the tier policy on (interactive requests, the default `max_decoding_seqs`), the
throughput with and without it. Then the `draft_model` method: the fp32 target alone and with its
own INT8 copy drafting (k = --draft-k), batch 1, free chat, and the drafts' cost.

    python -m benchmarks.speculative                       # SmolLM2, fp32 and bf16, 2 threads
    python -m benchmarks.speculative --dtypes bfloat16     # one dtype
    python -m benchmarks.speculative --max-k 4             # n-gram drafts of a fixed length k
    python -m benchmarks.speculative --methods draft_model # the INT8 self-draft only
    python -m benchmarks.speculative --smoke               # a tiny random model, in seconds

Both engines of a dtype live in one process and take turns step by step on the same requests, so
load on a shared machine falls on both alike; the load average is recorded before and after.
Prints Markdown tables and writes speculative.json and .png (n-gram) and
speculative_draft_model.json and .png under --out (benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable

from benchmarks.common import add_common_args, done, machine, out_dir, tiny_model
from engine import LLM, SamplingParams
from engine.speculative import parse_speculative_config

TEXT = (
    "def total(items):\n    result = 0\n    for item in items:\n        result += item.price * item.count\n"
    "    return result\n\ndef average(items):\n    if not items:\n        return 0\n"
    "    return total(items) / len(items)\n"
)
WORKLOADS = {
    "copy-heavy": [
        f"Repeat this code exactly:\n{TEXT}",
        f"Rename the function total to subtotal in this code and give the whole code back:\n{TEXT}",
        f"Add a docstring to each function of this code and give the whole code back:\n{TEXT}",
    ],
    "free chat": [
        "Tell me a short story about a lighthouse keeper who finds a message in a bottle.",
        "What are three good habits for staying healthy while working from home?",
        "Explain why the sky is blue to a ten-year-old.",
    ],
}
SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
DRAFT_SPEC = {"method": "draft_model", "model": "self", "quantization": "int8"}  # the INT8 self-draft
INTERACTIVE = 3  # the gateway's `priority` tier: speculates under the default policy (min_priority 2)


class DraftTimer:
    """Wraps the scheduler's drafter: the seconds spent making drafts."""

    def __init__(self, llm: LLM):
        self.seconds = 0.0
        drafter = llm.engine.scheduler.drafter
        inner = drafter.drafts

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        drafter.drafts = timed


def one_request(llm: LLM, rid: str, ids: list[int], tokens: int) -> tuple[float, int, list[int]]:
    """(seconds after the first token, tokens after it, all tokens) of one greedy request alone."""
    engine = llm.engine
    engine.add_request(rid, ids, SamplingParams(max_tokens=tokens, temperature=0), priority=INTERACTIVE)
    first, out = None, []
    while engine.has_unfinished():
        for o in engine.step():
            out += o.new_token_ids
            if first is None and o.new_token_ids:
                first = time.perf_counter()
    return time.perf_counter() - (first or time.perf_counter()), max(0, len(out) - 1), out


def race(llms: dict[str, LLM], requests: list[tuple[list[int], SamplingParams]]) -> dict[str, dict]:
    """The same requests on every engine, the engines stepping in turn (one step each, round robin),
    so a shared machine's load falls on all of them alike. Per engine: the seconds of its own steps
    (all of them, and those after its first output token), the process CPU seconds of its steps,
    its steps, its output tokens and each request's."""
    runs = {
        name: {"seconds": 0.0, "cpu_seconds": 0.0, "after_first": 0.0, "tokens": 0, "steps": 0, "outputs": {}}
        for name in llms
    }
    for name, llm in llms.items():
        for i, (ids, params) in enumerate(requests):
            rid = f"{name}-{i}-{time.monotonic_ns()}"
            llm.engine.add_request(rid, ids, params, priority=INTERACTIVE)
            runs[name]["outputs"][rid] = []
    while any(llm.engine.has_unfinished() for llm in llms.values()):
        for name, llm in llms.items():
            if not llm.engine.has_unfinished():
                continue
            run = runs[name]
            started = run["tokens"] > 0
            start, cpu = time.perf_counter(), time.process_time()
            outs = llm.engine.step()
            took = time.perf_counter() - start
            run["seconds"] += took
            run["cpu_seconds"] += time.process_time() - cpu  # the process's CPU: other load aside
            run["steps"] += 1
            run["after_first"] += took if started else 0.0
            for o in outs:
                run["outputs"][o.request_id] += o.new_token_ids
                run["tokens"] += len(o.new_token_ids)
    return runs


def batch_one(
    plain: LLM,
    spec: LLM,
    prompts: list[list[int]],
    tokens: int,
    drafting: Callable[[], float],
    name: str = "ngram",
) -> dict:
    """Each prompt alone on the plain and the speculating engine, raced step by step: milliseconds
    per output token after the first. `drafting`: the speculating engine's drafting seconds so far."""
    stats = spec.engine.stats
    drafted, kept, verified, drafted_s = (
        stats.spec_draft_tokens,
        stats.spec_accepted_tokens,
        stats.spec_verifications,
        drafting(),
    )
    lengths = dict(stats.spec_draft_lengths)
    seconds = {"plain": 0.0, name: 0.0}
    counted = {"plain": 0, name: 0}
    steps = {"plain": 0, name: 0}
    equal = True
    for ids in prompts:
        runs = race({"plain": plain, name: spec}, [(ids, SamplingParams(max_tokens=tokens, temperature=0))])
        for engine, run in runs.items():
            seconds[engine] += run["after_first"]
            counted[engine] += max(0, run["tokens"] - 1)
            steps[engine] += run["steps"]
        equal &= list(runs["plain"]["outputs"].values()) == list(runs[name]["outputs"].values())
    drafted = stats.spec_draft_tokens - drafted
    kept = stats.spec_accepted_tokens - kept
    verified = stats.spec_verifications - verified
    ms = {engine: 1000 * seconds[engine] / max(1, counted[engine]) for engine in seconds}
    return {
        "plain_ms_per_token": ms["plain"],
        f"{name}_ms_per_token": ms[name],
        "speedup": ms["plain"] / ms[name],
        "drafted_tokens": drafted,
        "accepted_tokens": kept,
        "acceptance_rate": kept / drafted if drafted else 0.0,
        "tokens_per_verification": (kept + verified) / verified if verified else 0.0,
        "draft_ms_per_token": 1000 * (drafting() - drafted_s) / max(1, counted[name]),
        "plain_steps": steps["plain"],
        f"{name}_steps": steps[name],
        # verifications by draft length: where the drafts' rows went
        "draft_lengths": {
            n: c - lengths.get(n, 0)
            for n, c in sorted(stats.spec_draft_lengths.items())
            if c > lengths.get(n, 0)
        },
        "greedy_outputs_equal": equal,
    }


def batch_32(plain: LLM, spec: LLM, prompts: list[list[int]], tokens: int, batch: int) -> dict:
    """`batch` concurrent interactive requests of staggered lengths (tokens/2 .. tokens), so the
    batch drains and its tail falls under max_decoding_seqs; raced step by step; throughput in
    output tokens per second of each engine's own steps."""
    drafted, verified = spec.engine.stats.spec_draft_tokens, spec.engine.stats.spec_verifications
    requests = [
        (
            prompts[i % len(prompts)],
            SamplingParams(
                max_tokens=tokens // 2 + (tokens // 2) * i // max(1, batch - 1),
                temperature=0,
                ignore_eos=True,
            ),
        )
        for i in range(batch)
    ]
    runs = race({"plain": plain, "ngram": spec}, requests)
    result = {f"{name}_tokens_per_s": run["tokens"] / run["seconds"] for name, run in runs.items()}
    for name, run in runs.items():  # where the time goes: steps, and tokens per CPU second
        result[f"{name}_steps"] = run["steps"]
        result[f"{name}_tokens_per_cpu_s"] = run["tokens"] / max(1e-9, run["cpu_seconds"])
    result["ngram_drafted_tokens"] = spec.engine.stats.spec_draft_tokens - drafted
    result["ngram_verifications"] = spec.engine.stats.spec_verifications - verified
    result["ratio"] = result["ngram_tokens_per_s"] / result["plain_tokens_per_s"]
    result["cpu_ratio"] = result["ngram_tokens_per_cpu_s"] / result["plain_tokens_per_cpu_s"]
    result["greedy_outputs_equal"] = list(runs["plain"]["outputs"].values()) == list(
        runs["ngram"]["outputs"].values()
    )
    return result


def ngram_config(args: argparse.Namespace) -> dict:
    """SPEC with --k and --max-k (unset: the config's default)."""
    config = {**SPEC, "num_speculative_tokens": args.k}
    if args.max_k is not None:
        config["max_num_speculative_tokens"] = args.max_k
    return config


def run_dtype(model: str, dtype: str, args: argparse.Namespace, tokens: int, batch: int) -> dict:
    common = dict(model=model, dtype=dtype, num_threads=args.threads)
    plain = LLM(**common)
    spec = LLM(**common, speculative_config=ngram_config(args))
    timer = DraftTimer(spec)
    encoded = {
        w: [plain.encode([{"role": "user", "content": p}]) for p in prompts]
        for w, prompts in WORKLOADS.items()
    }
    for llm in (plain, spec):  # warm-up: kernels compiled, first steps paid
        one_request(llm, "warm", encoded["copy-heavy"][0], 8)
    result: dict = {
        "one_call_decode": plain.engine.runner.model.decode is not None,
        "workloads": {
            w: batch_one(plain, spec, ids, tokens, lambda: timer.seconds) for w, ids in encoded.items()
        },
    }
    all_prompts = [ids for prompts in encoded.values() for ids in prompts]
    result["batch"] = {"size": batch, **batch_32(plain, spec, all_prompts, tokens, batch)}
    return result


def run_draft_model(model: str, args: argparse.Namespace, tokens: int) -> dict:
    """The fp32 target alone and with its INT8 copy drafting (k = --draft-k), batch 1, free chat."""
    common = dict(model=model, dtype="float32", num_threads=args.threads)
    plain = LLM(**common)
    spec = LLM(**common, speculative_config={**DRAFT_SPEC, "num_speculative_tokens": args.draft_k})
    drafter = spec.engine.scheduler.drafter
    prompts = [plain.encode([{"role": "user", "content": p}]) for p in WORKLOADS["free chat"]]
    for llm in (plain, spec):  # warm-up
        one_request(llm, "warm", prompts[0], 8)
    forwards, seconds = drafter.forwards, drafter.seconds
    row = batch_one(plain, spec, prompts, tokens, lambda: drafter.seconds, name="draft_model")
    row["draft_forward_ms"] = 1000 * (drafter.seconds - seconds) / max(1, drafter.forwards - forwards)
    return row


def draft_table(report: dict) -> str:
    r, k = report["free chat"], report["speculative_config"]["num_speculative_tokens"]
    return "\n".join(
        [
            f"| target | draft | workload | plain ms/token | draft_model (k={k}) ms/token | speed-up "
            "| drafts kept | tokens/verification | draft ms/token | draft forward ms | greedy equal |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
            f"| fp32 | INT8 self | free chat | {r['plain_ms_per_token']:.1f} | "
            f"{r['draft_model_ms_per_token']:.1f} | {r['speedup']:.2f}x | {r['acceptance_rate']:.0%} | "
            f"{r['tokens_per_verification']:.2f} | {r['draft_ms_per_token']:.1f} | "
            f"{r['draft_forward_ms']:.1f} | {'yes' if r['greedy_outputs_equal'] else 'no'} |",
        ]
    )


def table(report: dict) -> str:
    """The Markdown table of a run (what the README shows)."""
    spec = parse_speculative_config(report["speculative_config"])
    assert spec is not None
    k = f"k={spec.num_speculative_tokens}..{spec.max_draft_tokens}"
    lines = [
        f"| dtype | workload | plain ms/token | n-gram ({k}) ms/token | speed-up | drafts kept "
        "| steps plain / n-gram | draft ms/token | greedy equal |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for dtype, run in report["runs"].items():
        for w, r in run["workloads"].items():
            lines.append(
                f"| {dtype} | {w} | {r['plain_ms_per_token']:.1f} | {r['ngram_ms_per_token']:.1f} | "
                f"{r['speedup']:.2f}x | {r['acceptance_rate']:.0%} | "
                f"{r.get('plain_steps', '-')} / {r.get('ngram_steps', '-')} | "
                f"{r['draft_ms_per_token']:.3f} | "
                f"{'yes' if r['greedy_outputs_equal'] else 'no'} |"
            )
    lines += [
        "",
        "| dtype | batch | plain tokens/s | n-gram, tier policy on, tokens/s | ratio | CPU-time ratio "
        "| steps plain / n-gram | drafted tokens | greedy equal |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for dtype, run in report["runs"].items():
        b = run["batch"]
        lines.append(
            f"| {dtype} | {b['size']} | {b['plain_tokens_per_s']:.1f} | {b['ngram_tokens_per_s']:.1f} | "
            f"{b['ratio']:.3f}x | {b['cpu_ratio']:.3f}x | {b['plain_steps']} / {b['ngram_steps']} | "
            f"{b['ngram_drafted_tokens']} | "
            f"{'yes' if b['greedy_outputs_equal'] else 'no'} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument("--tokens", type=int, default=96, help="output tokens per prompt")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    parser.add_argument("--max-k", type=int, help="max_num_speculative_tokens (default: the config's)")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated dtypes")
    parser.add_argument("--batch", type=int, default=32, help="the throughput run's batch")
    parser.add_argument("--methods", default="ngram,draft_model", help="comma-separated methods")
    parser.add_argument("--draft-k", type=int, default=5, help="draft_model's num_speculative_tokens")
    args = parser.parse_args()
    out = out_dir(args, "speculative")
    model = tiny_model() if args.smoke else "smollm2"
    tokens = 8 if args.smoke else args.tokens
    batch = 4 if args.smoke else args.batch
    methods = args.methods.split(",")
    if "ngram" in methods:
        load_before = os.getloadavg()
        runs = {dtype: run_dtype(model, dtype, args, tokens, batch) for dtype in args.dtypes.split(",")}
        report = {
            "model": model,
            "threads": args.threads,
            "tokens_per_prompt": tokens,
            "speculative_config": ngram_config(args),
            "priority": INTERACTIVE,
            "runs": runs,
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
            "machine": machine(),
        }
        (out / "speculative.json").write_text(json.dumps(report, indent=2))
        plot(runs, out / "speculative.png", f"{model}, batch 1, {args.threads} threads, greedy")
        print(table(report))
        print(f"load average before {load_before[0]:.1f}, after {report['load_average_after'][0]:.1f}")
    if "draft_model" in methods:
        load_before = os.getloadavg()
        row = run_draft_model(model, args, tokens)
        report = {
            "model": model,
            "threads": args.threads,
            "tokens_per_prompt": tokens,
            "speculative_config": {**DRAFT_SPEC, "num_speculative_tokens": args.draft_k},
            "priority": INTERACTIVE,
            "free chat": row,
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
            "machine": machine(),
        }
        (out / "speculative_draft_model.json").write_text(json.dumps(report, indent=2))
        plot(
            {"fp32, INT8 self-draft": {"workloads": {"free chat": row}}},
            out / "speculative_draft_model.png",
            f"{model}, batch 1, {args.threads} threads, greedy, k={args.draft_k}",
            name="draft_model",
        )
        print(draft_table(report))
        print(f"load average before {load_before[0]:.1f}, after {report['load_average_after'][0]:.1f}")
    done(out)


def plot(runs: dict, path, title: str, name: str = "ngram") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, plain, ngram, kept = [], [], [], []
    for dtype, run in runs.items():
        for w, r in run["workloads"].items():
            labels.append(f"{dtype}\n{w}")
            plain.append(r["plain_ms_per_token"])
            ngram.append(r[f"{name}_ms_per_token"])
            kept.append(r["acceptance_rate"])
    fig, ax = plt.subplots(figsize=(1.6 * len(labels) + 2, 3.8))
    xs = range(len(labels))
    ax.bar([x - 0.2 for x in xs], plain, 0.4, label="no speculation", color="#888")
    bars = ax.bar([x + 0.2 for x in xs], ngram, 0.4, label=f"{name} drafts", color="#2a7")
    for bar, p, n, a in zip(bars, plain, ngram, kept):
        ax.annotate(
            f"{p / n:.2f}x\n{a:.0%} kept",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.set_xticks(list(xs), labels, fontsize=8)
    ax.set_ylabel("ms per output token")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
