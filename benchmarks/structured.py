"""Structured outputs: what a JSON-Schema constraint costs the engine (SmolLM2, fp32).

    python -m benchmarks.structured            # 32 + 32 requests on the real SmolLM2
    python -m benchmarks.structured --smoke    # a tiny random model with SmolLM2's tokenizer, 4 + 4 requests

1. Throughput: a batch of `--requests` chat requests, each with a JSON schema (a few schemas in
   turn, sampled at temperature 1 with a seed each), against the same requests unconstrained, each
   asked for exactly as many tokens as its constrained twin produced (ignore_eos), so both runs
   decode the same number of tokens. The schemas are compiled before the timed runs (the grammar
   cache is warm), and one unrecorded round runs first (every batch shape seen once). Then
   `--rounds` rounds alternate the constrained batch and its unconstrained twin; output tokens per
   second of each (the median over the rounds, every round's value kept in the JSON), and their ratio.
2. Time to first token of one request on an idle engine with a schema never seen (cold: compiled on
   the grammar thread while the request waits) against the same schema again (cached), medians of
   `--ttft-repeats` fresh schemas; and the same request unconstrained.

Writes structured.json and structured.png under --out (benchmarks/results) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from benchmarks.common import add_common_args, done, machine, out_dir, tiny_model
from engine import Engine, SamplingParams, StructuredSpec

ENGINE = {
    "model": "smollm2",
    "dtype": "float32",
    "num_threads": 2,
    "max_num_seqs": 32,
    "max_num_batched_tokens": 2048,
    "incremental_text": False,
}
SCHEMAS = [
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 24},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "email": {"type": "string", "maxLength": 40},
        },
        "required": ["name", "age", "email"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 24},
            "country": {"type": "string", "maxLength": 24},
            "population": {"type": "integer", "minimum": 0, "maximum": 50000000},
            "capital": {"type": "boolean"},
        },
        "required": ["city", "country", "population", "capital"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "title": {"type": "string", "maxLength": 40},
            "tags": {
                "type": "array",
                "items": {"enum": ["news", "sport", "tech", "art"]},
                "minItems": 1,
                "maxItems": 3,
            },
            "rating": {"type": "integer", "minimum": 1, "maximum": 5},
        },
        "required": ["title", "tags", "rating"],
        "additionalProperties": False,
    },
]
TOPICS = ["a person", "a city", "an article", "a friend", "a capital", "a blog post", "a colleague", "a town"]


def prompts(eng: Engine, n: int) -> list[list[int]]:
    return [
        eng.tokenizer.apply_chat_template(
            [{"role": "user", "content": f"Describe {TOPICS[i % len(TOPICS)]} as JSON."}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for i in range(n)
    ]


def run_batch(eng: Engine, ids: list[list[int]], params: list[SamplingParams]) -> tuple[float, list[int]]:
    """Wall seconds to serve the batch, and each request's output token count."""
    counts = {str(i): 0 for i in range(len(ids))}
    t0 = time.perf_counter()
    for i, (p, sp) in enumerate(zip(ids, params)):
        eng.add_request(str(i), p, sp)
    while eng.has_unfinished():
        for out in eng.step():
            counts[out.request_id] += len(out.new_token_ids)
    return time.perf_counter() - t0, [counts[str(i)] for i in range(len(ids))]


def throughput(eng: Engine, n: int, max_tokens: int, rounds: int) -> dict:
    """One unrecorded warm-up round (every batch shape seen once), then `rounds` rounds of the
    constrained batch followed by its unconstrained twin; medians of each, every round's values kept."""
    ids = prompts(eng, n)
    specs = [StructuredSpec.json_schema(s) for s in SCHEMAS]
    for spec in specs:  # compile every schema first: the timed run measures decoding, not compiling
        eng.structured.cache.get(spec).result()
    constrained = [
        SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=i, structured=specs[i % len(specs)])
        for i in range(n)
    ]
    runs: dict[str, list[float]] = {
        "constrained_tokens_per_s": [],
        "unconstrained_tokens_per_s": [],
        "constrained_s": [],
        "unconstrained_s": [],
        "output_tokens": [],
    }
    for r in range(rounds + 1):  # round 0: the warm-up
        c_wall, counts = run_batch(eng, ids, constrained)
        free = [
            SamplingParams(max_tokens=c, temperature=1.0, seed=i, ignore_eos=True)
            for i, c in enumerate(counts)
        ]
        f_wall, free_counts = run_batch(eng, ids, free)
        if r > 0:
            runs["constrained_s"].append(c_wall)
            runs["unconstrained_s"].append(f_wall)
            runs["output_tokens"].append(sum(counts))
            runs["constrained_tokens_per_s"].append(sum(counts) / c_wall)
            runs["unconstrained_tokens_per_s"].append(sum(free_counts) / f_wall)
    c_tps = statistics.median(runs["constrained_tokens_per_s"])
    f_tps = statistics.median(runs["unconstrained_tokens_per_s"])
    return {
        "requests": n,
        "rounds": rounds,
        "output_tokens": statistics.median(runs["output_tokens"]),
        "constrained_tokens_per_s": c_tps,
        "unconstrained_tokens_per_s": f_tps,
        "ratio": c_tps / f_tps,
        "round_ratios": [
            c / f for c, f in zip(runs["constrained_tokens_per_s"], runs["unconstrained_tokens_per_s"])
        ],
        "all": runs,
    }


def first_token_s(eng: Engine, ids: list[int], params: SamplingParams) -> float:
    t0 = time.perf_counter()
    eng.add_request("ttft", ids, params)
    while eng.has_unfinished():
        outs = eng.step()
        if any(o.new_token_ids for o in outs):
            eng.abort("ttft")
            break
    return time.perf_counter() - t0


def ttft(eng: Engine, repeats: int) -> dict:
    ids = prompts(eng, 1)[0]
    cold, cached, free = [], [], []
    for r in range(repeats):
        schema = json.loads(json.dumps(SCHEMAS[r % len(SCHEMAS)]))
        schema["properties"][f"note_{r}_{time.time_ns()}"] = {"type": "string", "maxLength": 8}  # never seen
        spec = StructuredSpec.json_schema(schema)
        cold.append(first_token_s(eng, ids, SamplingParams(max_tokens=4, temperature=0, structured=spec)))
        cached.append(first_token_s(eng, ids, SamplingParams(max_tokens=4, temperature=0, structured=spec)))
        free.append(first_token_s(eng, ids, SamplingParams(max_tokens=4, temperature=0)))
    return {
        "repeats": repeats,
        "cold_s": statistics.median(cold),
        "cached_s": statistics.median(cached),
        "unconstrained_s": statistics.median(free),
        "all": {"cold": cold, "cached": cached, "unconstrained": free},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument(
        "--rounds", type=int, default=3, help="timed constrained/unconstrained rounds after a warm-up"
    )
    ap.add_argument("--ttft-repeats", type=int, default=5)
    ap.add_argument("--dtype", default=ENGINE["dtype"])
    add_common_args(ap)
    args = ap.parse_args()
    out = out_dir(args, "structured")
    ENGINE["dtype"] = args.dtype
    if args.smoke:
        ENGINE.update(model=tiny_model(), dtype="float32")
        args.requests, args.max_tokens, args.ttft_repeats, args.rounds = 4, 24, 2, 1
    torch.set_num_threads(ENGINE["num_threads"])
    eng = Engine(**ENGINE)
    print("throughput ...", flush=True)
    tput = throughput(eng, args.requests, args.max_tokens, args.rounds)
    print("time to first token ...", flush=True)
    first = ttft(eng, args.ttft_repeats)
    report = {
        **ENGINE,
        "smoke": args.smoke,
        "machine": machine(),
        "torch": torch.__version__,
        "max_tokens": args.max_tokens,
        "throughput": tput,
        "ttft": first,
        "grammar_cache": {"hits": eng.structured.cache.hits, "misses": eng.structured.cache.misses},
    }
    (out / "structured.json").write_text(json.dumps(report, indent=2))
    print_table(tput, first)
    plot(tput, first, out / "structured.png", ENGINE["model"])
    done(out)


def print_table(tput: dict, first: dict) -> None:
    print(
        f"\n| {tput['requests']} requests | output tokens/s | TTFT ms (cold schema) | TTFT ms (cached "
        "schema) |"
    )
    print("|---|---:|---:|---:|")
    print(
        f"| JSON schema | {tput['constrained_tokens_per_s']:.1f} | {first['cold_s'] * 1e3:.0f} "
        f"| {first['cached_s'] * 1e3:.0f} |"
    )
    print(
        f"| unconstrained | {tput['unconstrained_tokens_per_s']:.1f} | {first['unconstrained_s'] * 1e3:.0f} "
        f"| {first['unconstrained_s'] * 1e3:.0f} |"
    )
    print(f"\nconstrained / unconstrained throughput: {tput['ratio']:.2f}")


def plot(tput: dict, first: dict, path, model: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.bar(
        ["JSON schema", "unconstrained"],
        [tput["constrained_tokens_per_s"], tput["unconstrained_tokens_per_s"]],
        color=["tab:blue", "tab:gray"],
    )
    a.set_ylabel("output tokens/s")
    a.set_title(f"{tput['requests']} requests in one batch (ratio {tput['ratio']:.2f})")
    b.bar(
        ["cold schema", "cached schema", "unconstrained"],
        [first["cold_s"] * 1e3, first["cached_s"] * 1e3, first["unconstrained_s"] * 1e3],
        color=["tab:red", "tab:blue", "tab:gray"],
    )
    b.set_ylabel("time to first token, ms (median)")
    b.set_title("one request, idle engine")
    fig.suptitle(f"structured outputs, {model.rsplit('/', 1)[-1]}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
