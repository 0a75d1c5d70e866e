"""What a draft made from the target's own weights can give at batch 1 on free chat: the INT8 copy
of the target and shallower INT8 copies (layers dropped, LayerSkip-style), measured against the
target's greedy output, before a `draft_model` method exists in the engine.

For greedy decoding a draft token is kept exactly when it equals the target's argmax after the
target's own prefix, so the target's greedy continuation fed to a draft as a prompt (its prompt
log-probabilities, top 1) gives, position by position, whether the draft would have agreed and how
confident it was. Rounds of speculation are then replayed over that record: k drafts (or fewer,
stopping at the first one whose draft probability is under a threshold), the kept prefix plus the
target's token. The time of a round is k draft decode steps plus one target step over k + 1 rows;
both are measured on this machine (batch-1 decode of the draft; a target decode step of k + 1
rows, which is what verification as decode rows costs, taken as never below the step of fewer
rows). Assumptions stated in the JSON: the draft
catches up on the target's token within its next step, and a draft's confidence after a rejected
draft is taken from the target's prefix (only the cost of drafts already lost depends on it).

    python -m benchmarks.self_draft            # SmolLM2, target fp32, 2 threads
    python -m benchmarks.self_draft --smoke

Writes self_draft.json and self_draft.png under --out (benchmarks/results); prints a table.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shutil
import time
from pathlib import Path

from benchmarks.common import add_common_args, done, machine, out_dir, tiny_model
from benchmarks.speculative import WORKLOADS
from engine import LLM, SamplingParams

MIDDLE_DROPS = {"int8": 0, "int8 -6 layers": 6, "int8 -10 layers": 10, "int8 -15 layers": 15}
THRESHOLDS = (None, 0.4, 0.6, 0.8)  # stop drafting below this draft probability (None: never)


def shallow_copy(model_path: str, drop: int) -> str:
    """The model's folder with `drop` middle layers removed (renumbered), beside the original."""
    if drop == 0:
        return model_path
    from safetensors import safe_open
    from safetensors.torch import save_file

    src = Path(model_path)
    config = json.loads((src / "config.json").read_text())
    n = config["num_hidden_layers"]
    start = (n - drop) // 2  # the first and last layers stay: the middle ones change the least
    keep = [i for i in range(n) if not start <= i < start + drop]
    dst = src.parent / f"{src.name}-drop{start}-{start + drop}"
    if (dst / "config.json").exists():
        return str(dst)
    tmp = dst.with_name(dst.name + f".tmp{os.getpid()}")
    shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("*.safetensors"))
    tensors = {}
    for file in src.glob("*.safetensors"):
        with safe_open(file, "pt") as f:
            for name in f.keys():
                parts = name.split(".")
                if "layers" in parts:
                    at = parts.index("layers") + 1
                    layer = int(parts[at])
                    if layer not in keep:
                        continue
                    parts[at] = str(keep.index(layer))
                tensors[".".join(parts)] = f.get_tensor(name)
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps({**config, "num_hidden_layers": len(keep)}, indent=2))
    tmp.rename(dst)
    return str(dst)


def decode_ms(llm: LLM, prompt: list[int], batch: int, tokens: int) -> float:
    """Milliseconds of a decode-only step at `batch` rows (every sequence decoding)."""
    engine = llm.engine
    for i in range(batch):
        params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
        engine.add_request(f"d{batch}-{i}-{time.monotonic_ns()}", prompt, params)
    engine.step()  # the prefills
    times = []
    while engine.has_unfinished():
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    times = sorted(times[:-1] or times)
    return 1000 * times[len(times) // 2]  # the median step


def agreement(
    draft: LLM, prompts: list[list[int]], targets: list[list[int]]
) -> list[list[tuple[bool, float]]]:
    """Per prompt, per target token: (the draft's top-1 is that token, the draft's top-1 prob)."""
    fed = [p + t for p, t in zip(prompts, targets)]
    outs = draft.generate(fed, SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=1))
    record = []
    for p, t, out in zip(prompts, targets, outs):
        rows = out.prompt_logprobs[len(p) : len(p) + len(t)]  # the rows predicting each target token
        record.append([(lp.top[0][0] == tok, math.exp(lp.top[0][1])) for lp, tok in zip(rows, t)])
    return record


def replay(record, k: int, threshold: float | None, t_draft: float, verify_ms: list[float]) -> dict:
    """Speculation rounds over the agreement record: tokens per target step, time per token."""
    tokens = cost = rounds = drafted = kept = 0.0
    for seq in record:
        p = 0
        while p < len(seq):
            m = 0
            while m < k and p + m < len(seq) and (threshold is None or seq[p + m][1] >= threshold):
                m += 1
            a = 0
            while a < m and seq[p + a][0]:
                a += 1
            tokens += a + 1
            cost += m * t_draft + verify_ms[m]
            rounds, drafted, kept = rounds + 1, drafted + m, kept + a
            p += a + 1
    return {
        "ms_per_token": cost / tokens,
        "tokens_per_round": tokens / rounds,
        "acceptance_rate": kept / drafted if drafted else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument("--tokens", type=int, default=96, help="target tokens per prompt")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="float32", help="the target's dtype")
    parser.add_argument("--max-k", type=int, default=6)
    args = parser.parse_args()
    out = out_dir(args, "self_draft")
    model = tiny_model() if args.smoke else "smollm2"
    tokens = 8 if args.smoke else args.tokens
    load_before = os.getloadavg()
    target = LLM(model=model, dtype=args.dtype, num_threads=args.threads)
    prompts = [target.encode([{"role": "user", "content": p}]) for p in WORKLOADS["free chat"]]
    greedy = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    targets = [c.token_ids for c in target.generate(prompts, greedy)]
    steps = 4 if args.smoke else 24
    measured = [decode_ms(target, prompts[0], rows, steps) for rows in range(1, args.max_k + 2)]
    verify_ms = list(itertools.accumulate(measured, max))  # more rows never cost less (noise aside)
    del target
    path = target_path = LLM(model=model, dtype="float32", num_threads=1).engine.model_path
    drafts = {}
    for name, drop in ({"int8": 0, "int8 -1 layers": 1} if args.smoke else MIDDLE_DROPS).items():
        path = shallow_copy(str(target_path), drop)
        llm = LLM(model=path, dtype="float32", quantization="int8", num_threads=args.threads)
        record = agreement(llm, prompts, targets)
        t_draft = decode_ms(llm, prompts[0], 1, steps)
        flat = [a for seq in record for a, _ in seq]
        rows = {
            f"k={k} stop<{th}": replay(record, k, th, t_draft, verify_ms)
            for k in range(1, args.max_k + 1)
            for th in THRESHOLDS
        }
        best = min(rows, key=lambda r: rows[r]["ms_per_token"])
        drafts[name] = {
            "layers_dropped": drop,
            "draft_ms_per_step": t_draft,
            "draft_cost_share": t_draft / verify_ms[0],
            "agreement": sum(flat) / len(flat),
            "replays": rows,
            "best": best,
            "best_speedup": verify_ms[0] / rows[best]["ms_per_token"],
            "record": [[[int(a), round(c, 4)] for a, c in seq] for seq in record],
        }
        del llm
    report = {
        "model": model,
        "target_dtype": args.dtype,
        "threads": args.threads,
        "tokens_per_prompt": tokens,
        "target_step_ms_by_rows": measured,
        "verify_ms_by_rows": verify_ms,
        "drafts": drafts,
        "assumptions": "k draft steps per round; verification = a target decode step of k + 1 rows",
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "machine": machine(),
    }
    (out / "self_draft.json").write_text(json.dumps(report, indent=2))
    plot(drafts, verify_ms[0], out / "self_draft.png", f"{model} target {args.dtype}, batch 1, free chat")
    print(f"target step ms by rows 1..{args.max_k + 1}: " + ", ".join(f"{t:.1f}" for t in measured))
    print("| draft | draft step / target step | agreement | best | kept | tokens/round | speed-up |")
    print("|---|---:|---:|---|---:|---:|---:|")
    for name, d in drafts.items():
        b = d["replays"][d["best"]]
        print(
            f"| {name} | {d['draft_cost_share']:.2f} | {d['agreement']:.0%} | {d['best']} | "
            f"{b['acceptance_rate']:.0%} | {b['tokens_per_round']:.2f} | {d['best_speedup']:.2f}x |"
        )
    print(f"load average before {load_before[0]:.1f}, after {report['load_average_after'][0]:.1f}")
    done(out)


def plot(drafts: dict, target_ms: float, path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.8))
    for name, d in drafts.items():
        ks = sorted({int(r.split()[0][2:]) for r in d["replays"]})
        fastest = [
            min(v["ms_per_token"] for r, v in d["replays"].items() if r.startswith(f"k={k} ")) for k in ks
        ]
        ax.plot(ks, [target_ms / ms for ms in fastest], marker="o", label=name)
    ax.axhline(1.0, color="#888", lw=0.8)
    ax.set_xlabel("draft tokens k (best stopping threshold)")
    ax.set_ylabel("speed-up over the target alone (replayed)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
