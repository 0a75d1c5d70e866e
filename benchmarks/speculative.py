"""Speculative decoding with prompt-lookup (n-gram) drafts at batch 1: milliseconds per output
token with and without it on a copy-heavy workload (prompts that ask to repeat or edit a given
text), greedy, and the share of drafted tokens kept.

    python -m benchmarks.speculative                 # SmolLM2 fp32, 2 threads, 96 tokens a prompt
    python -m benchmarks.speculative --smoke         # a tiny random model, in seconds

Writes speculative.json and speculative.png under --out (benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import time

from benchmarks.common import add_common_args, done, machine, out_dir, tiny_model
from engine import LLM, SamplingParams

TEXT = (
    "def total(items):\n    result = 0\n    for item in items:\n        result += item.price * item.count\n"
    "    return result\n\ndef average(items):\n    if not items:\n        return 0\n"
    "    return total(items) / len(items)\n"
)
PROMPTS = [
    f"Repeat this code exactly:\n{TEXT}",
    f"Rename the function total to subtotal in this code and give the whole code back:\n{TEXT}",
    f"Add a docstring to each function of this code and give the whole code back:\n{TEXT}",
]
SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}


def ms_per_token(llm: LLM, prompts: list[list[int]], tokens: int) -> dict:
    """One request at a time; time after the first token over the tokens after it."""
    engine = llm.engine
    llm.generate([prompts[0]], SamplingParams(max_tokens=4, temperature=0))  # warm-up
    stats = engine.stats
    drafted, kept = stats.spec_draft_tokens, stats.spec_accepted_tokens
    per_prompt, total_s, total_tokens = [], 0.0, 0
    for i, ids in enumerate(prompts):
        engine.add_request(f"r{i}", ids, SamplingParams(max_tokens=tokens, temperature=0))
        first = None
        out_tokens = 0
        start = time.perf_counter()
        while engine.has_unfinished():
            for out in engine.step():
                out_tokens += len(out.new_token_ids)
                if first is None and out.new_token_ids:
                    first = time.perf_counter()
        end = time.perf_counter()
        ms = 1000 * (end - first) / max(1, out_tokens - 1)
        per_prompt.append({"ms_per_token": ms, "tokens": out_tokens, "ttft_s": first - start})
        total_s += end - first
        total_tokens += out_tokens - 1
    drafted = stats.spec_draft_tokens - drafted
    kept = stats.spec_accepted_tokens - kept
    return {
        "ms_per_token": 1000 * total_s / max(1, total_tokens),
        "per_prompt": per_prompt,
        "drafted_tokens": drafted,
        "accepted_tokens": kept,
        "acceptance_rate": kept / drafted if drafted else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument("--tokens", type=int, default=96, help="output tokens per prompt")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    args = parser.parse_args()
    out = out_dir(args, "speculative")
    model = tiny_model() if args.smoke else "smollm2"
    tokens = 8 if args.smoke else args.tokens
    common = dict(model=model, dtype="float32", num_threads=args.threads)
    spec = {**SPEC, "num_speculative_tokens": args.k, "min_priority": 0}
    runs = {}
    outputs = {}
    for name, extra in (("plain", {}), ("ngram", {"speculative_config": spec})):
        llm = LLM(**common, **extra)
        prompts = [llm.encode([{"role": "user", "content": p}]) for p in PROMPTS]
        runs[name] = ms_per_token(llm, prompts, tokens)
        outputs[name] = [
            c.token_ids for c in llm.generate(prompts, SamplingParams(max_tokens=tokens, temperature=0))
        ]
        del llm
    report = {
        "model": model,
        "threads": args.threads,
        "tokens_per_prompt": tokens,
        "speculative_config": spec,
        "runs": runs,
        "speedup": runs["plain"]["ms_per_token"] / runs["ngram"]["ms_per_token"],
        "greedy_outputs_equal": outputs["plain"] == outputs["ngram"],
        "machine": machine(),
    }
    (out / "speculative.json").write_text(json.dumps(report, indent=2))
    plot(runs, out / "speculative.png", f"{model}, batch 1, {args.threads} threads, copy-heavy prompts")
    print(
        f"plain {runs['plain']['ms_per_token']:.1f} ms/token, ngram {runs['ngram']['ms_per_token']:.1f} "
        f"ms/token ({report['speedup']:.2f}x), acceptance {runs['ngram']['acceptance_rate']:.0%}, "
        f"greedy equal: {report['greedy_outputs_equal']}"
    )
    done(out)


def plot(runs: dict, path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    names = list(runs)
    bars = ax.bar(names, [runs[n]["ms_per_token"] for n in names], color=["#888", "#2a7"])
    for bar, n in zip(bars, names):
        label = f"{runs[n]['ms_per_token']:.1f} ms"
        if n != "plain":
            label += f"\n{runs[n]['acceptance_rate']:.0%} kept"
        ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom")
    ax.set_ylabel("ms per output token")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
