"""The host part of an engine decode step, on the CPU with a tiny random-weight Llama: a step's wall
time less its model compute (the decoder forward and the LM head), at batch 1 and 64 over a context
of a few hundred tokens. What stays is the Python a GPU step pays beside its kernels (scheduling,
the batch's metadata, sampling's bookkeeping, output processing, statistics, the step-cost model),
so a host-side regression shows here without a GPU. Parts are timed by wrapping the engine's
methods; the per-sequence cost is (host at the largest batch - host at batch 1) / (batch - 1).

    python3 -m benchmarks.host_step                        # this tree, batch 1 and 64, context 256
    python3 -m benchmarks.host_step --against old=/tmp/old # and another checkout's engine, interleaved
    python3 -m benchmarks.host_step --batches 1,64,128 --block-size 1 --context 256  # 257-block tables
    chrt -r 10 python3 -m benchmarks.host_step ...         # steadier on a shared machine
    python3 -m benchmarks.host_step --smoke                # seconds

Each (checkout, round) runs in a fresh process with that checkout first on PYTHONPATH (one torch
thread); rounds alternate the checkouts and the medians over rounds are reported. Writes
host_step.json and host_step.png under --out (benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# a 2-layer Llama whose forward costs little, so the engine's own work is most of a step
SHAPE = {
    "vocab_size": 512,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "tie_word_embeddings": True,
    "max_position_embeddings": 2048,
}
# host parts timed per step: name -> (object path on the engine, method); absent ones are skipped
PARTS = {
    "schedule": ("scheduler", "schedule"),
    "stage": ("runner", "stage"),
    "prepare": ("runner", "_prepare"),
    "sample": ("runner", "_sample"),
    "observe_step": ("scheduler", "observe_step"),
    "finish_step": ("scheduler", "finish_step"),
    "record_step": ("stats", "record_step"),
    "process": ("output", "process"),
}
MODEL_PARTS = ("forward", "logits")  # LlamaModel methods: the compute a GPU runs as kernels


def _wrap(obj, name: str, into: list[float]) -> None:
    fn = getattr(obj, name)

    def timed(*a, **kw):
        t = time.perf_counter()
        out = fn(*a, **kw)
        into.append(time.perf_counter() - t)
        return out

    setattr(obj, name, timed)


class _TimedDecode:
    """The one-call decode forward (LlamaModel.decode), timed as model compute."""

    def __init__(self, decode, into: list[float]):
        self._decode, self._into = decode, into

    def __call__(self, *a, **kw):
        t = time.perf_counter()
        out = self._decode(*a, **kw)
        self._into.append(time.perf_counter() - t)
        return out

    def __getattr__(self, name: str):
        return getattr(self._decode, name)


def measure(batch: int, context: int, steps: int, block_size: int = 16) -> dict:
    """Median per-step microseconds of a decode step of `batch` sequences of `context` tokens: wall,
    model compute, host (wall - model) and each host part, with the engine on sys.path."""
    import torch

    from engine import LLM, SamplingParams

    torch.set_num_threads(1)
    prefill_steps = -(-batch * context // 256)
    max_len = context + steps + 64 + prefill_steps
    llm = LLM(
        model="dummy",
        dummy_config=SHAPE,
        device="cpu",
        dtype="float32",
        # every sequence's KV fits (fp32 K and V of each layer), so none is preempted
        kv_cache_gib=max(0.05, 3 * batch * max_len * 2 * _kv_bytes_per_token() / 2**30),
        max_num_seqs=batch,
        max_model_len=max_len,
        block_size=block_size,
    )
    eng, rng = llm.engine, random.Random(batch)
    # the first sequences decode while the last prefill (at least 256 prompt tokens a step)
    params = SamplingParams(max_tokens=steps + 16 + prefill_steps, temperature=0, ignore_eos=True)
    for i in range(batch):
        eng.add_request(f"h{i}", [rng.randrange(2, SHAPE["vocab_size"]) for _ in range(context)], params)
    while not all(s.num_output_tokens > 0 for s in eng.seqs.values()):
        eng.step()
    for _ in range(3):
        eng.step()
    times: dict[str, list[float]] = defaultdict(list)
    model = eng.runner.model
    for name in MODEL_PARTS:
        _wrap(model, name, times["model"])
    if getattr(model, "decode", None) is not None:
        model.decode = _TimedDecode(model.decode, times["model"])
    for part, (path, name) in PARTS.items():
        obj = eng
        for attr in path.split("."):
            obj = getattr(obj, attr)
        if hasattr(obj, name):
            _wrap(obj, name, times[part])
    walls, models = [], []
    for _ in range(steps):
        assert eng.num_running == batch
        n = len(times["model"])
        t = time.perf_counter()
        eng.step()
        walls.append(time.perf_counter() - t)
        models.append(sum(times["model"][n:]))
    us = 1e6
    row = {
        "batch": batch,
        "context": context,
        "block_size": block_size,
        "steps": steps,
        "wall_us": statistics.median(walls) * us,
        "model_us": statistics.median(models) * us,
        "host_us": statistics.median(w - m for w, m in zip(walls, models, strict=True)) * us,
    }
    row["parts_us"] = {p: statistics.median(v) * us for p, v in times.items() if p != "model" and v}
    return row


def _kv_bytes_per_token() -> int:
    return SHAPE["num_hidden_layers"] * SHAPE["num_key_value_heads"] * SHAPE["head_dim"] * 4


def run_child(tree: Path, batches: list[int], context: int, steps: int, block_size: int) -> list[dict]:
    """measure() for each batch in a fresh process with `tree`'s engine first on the path."""
    from benchmarks.common import in_checkout

    args = ["--child", "--context", str(context), "--block-size", str(block_size)]
    args += ["--steps", str(steps), "--batches", ",".join(map(str, batches))]
    return in_checkout(tree, __file__, args, env={"OMP_NUM_THREADS": "1"})


def summarize(rounds: list[list[dict]]) -> dict:
    """Medians over rounds, per batch, and the per-sequence host cost."""
    by_batch: dict[int, list[dict]] = defaultdict(list)
    for rows in rounds:
        for row in rows:
            by_batch[row["batch"]].append(row)
    out: dict = {"batches": {}}
    for batch, rows in sorted(by_batch.items()):
        med = {k: statistics.median(r[k] for r in rows) for k in ("wall_us", "model_us", "host_us")}
        parts = {p for r in rows for p in r["parts_us"]}
        med["parts_us"] = {
            p: statistics.median(r["parts_us"].get(p, 0.0) for r in rows) for p in sorted(parts)
        }
        med["host_us_rounds"] = [r["host_us"] for r in rows]
        out["batches"][str(batch)] = med
    lo, hi = min(by_batch), max(by_batch)
    if hi > lo:
        host = out["batches"]
        out["per_seq_us"] = (host[str(hi)]["host_us"] - host[str(lo)]["host_us"]) / (hi - lo)
    return out


def plot(result: dict, path: Path) -> None:
    """Host µs per step for each checkout and batch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(result["trees"])
    batches = list(next(iter(result["trees"].values()))["batches"])
    fig, axes = plt.subplots(1, len(batches), figsize=(3.2 * len(batches), 3.2))
    for ax, batch in zip(axes if len(batches) > 1 else [axes], batches, strict=True):
        host = [result["trees"][t]["batches"][batch]["host_us"] for t in labels]
        ax.bar(labels, host, color="tab:blue")
        ax.set_title(f"batch {batch}")
        ax.set_ylabel("host µs / decode step")
    blocks = -(-(result["context"] + 1) // result.get("block_size", 16))
    title = f"engine step less model compute, CPU, context {result['context']} ({blocks} blocks)"
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument(
        "--block-size",
        type=int,
        default=16,
        help="KV block size (a long table at a small cost: --block-size 1 --context 256 gives 257 blocks)",
    )
    ap.add_argument("--steps", type=int, default=200, help="decode steps timed per batch and round")
    ap.add_argument("--rounds", type=int, default=5, help="fresh processes per checkout, alternating")
    ap.add_argument(
        "--against",
        action="append",
        default=[],
        metavar="LABEL=PATH",
        help="another checkout whose engine runs the same measurement (repeatable)",
    )
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--smoke", action="store_true", help="batches 1 and 4, a few steps, one round")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    if args.child:
        sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
        for batch in batches:
            print(json.dumps(measure(batch, args.context, args.steps, args.block_size)), flush=True)
        return
    sys.path.insert(0, str(REPO))
    from benchmarks.common import checkouts, done, machine, out_dir

    if args.smoke:
        batches, args.context, args.steps, args.rounds = [1, 4], 64, 10, 1
    trees = checkouts(args.against)
    rounds: dict[str, list[list[dict]]] = defaultdict(list)
    for r in range(args.rounds):
        for label, tree in trees.items():
            rounds[label].append(run_child(tree, batches, args.context, args.steps, args.block_size))
            row = rounds[label][-1]
            print(
                f"round {r} {label}: " + ", ".join(f"b{x['batch']} host {x['host_us']:.1f} µs" for x in row)
            )
    result = {
        "machine": machine(),
        "context": args.context,
        "block_size": args.block_size,
        "steps": args.steps,
        "rounds": args.rounds,
        "shape": SHAPE,
        "trees": {label: {"path": str(trees[label]), **summarize(rows)} for label, rows in rounds.items()},
    }
    for label, res in result["trees"].items():
        cells = [
            f"b{b} host {v['host_us']:.1f} µs (wall {v['wall_us']:.1f})" for b, v in res["batches"].items()
        ]
        per_seq = res.get("per_seq_us")
        print(f"{label}: " + "; ".join(cells) + (f"; per sequence {per_seq:.2f} µs" if per_seq else ""))
    out = out_dir(args, "host_step")
    (out / "host_step.json").write_text(json.dumps(result, indent=1))
    plot(result, out / "host_step.png")
    done(out)


if __name__ == "__main__":
    main()
