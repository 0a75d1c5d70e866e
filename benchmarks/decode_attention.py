"""The cpu backend's bf16 paged decode kernel alone (engine/attention/csrc/paged_decode_bf16.h, through
ctypes): SmolLM2-135M's attention shape (9 query heads, 3 KV heads, head_dim 64) over 30 layers'
caches in the real layout ([2, KVH, slots, D] per layer, blocks of 16), so that a call of every
layer streams its K/V from memory as a decode step does, at rows of 100-600 tokens of context.

    python3 -m benchmarks.decode_attention                          # this tree, rows 16, 40, 64
    python3 -m benchmarks.decode_attention --against old=/tmp/old   # and another checkout, interleaved
    python3 -m benchmarks.decode_attention --smoke                  # seconds

Each (checkout, round) runs in a fresh process with that checkout first on PYTHONPATH; rounds
alternate the checkouts, so a busy machine slows them alike. Per round: the median over --reps of
the 30 layers' kernel calls; reported: the median over rounds, the K/V bytes read per second, and
each checkout's ratio to this tree. --shuffle hands the blocks out in a random order (a long-running
server's free list) instead of one run per sequence (a fresh one). Writes decode_attention.json
and .png under --out.
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
H, KVH, D, BLOCK = 9, 3, 64, 16


def measure(rows: int, layers: int, reps: int, threads: int, shuffle: bool) -> dict:
    """ms per pass over `layers` layers' kernel calls (median of reps) at `rows` sequences."""
    import torch

    from engine.attention.cpu_paged import load_library

    rng = random.Random(rows)
    lens = [rng.randrange(100, 600) for _ in range(rows)]
    nblocks = [-(-n // BLOCK) for n in lens]
    ids = list(range(sum(nblocks)))
    if shuffle:
        rng.shuffle(ids)
    width, used = max(nblocks), 0
    tables = torch.zeros(rows, width, dtype=torch.int32)
    for i, nb in enumerate(nblocks):
        tables[i, :nb] = torch.tensor(ids[used : used + nb], dtype=torch.int32)
        used += nb
    ctx = torch.tensor(lens, dtype=torch.int32)
    slots = len(ids) * BLOCK
    gen = torch.Generator().manual_seed(rows)
    caches = [torch.randn(2, KVH, slots, D, generator=gen).bfloat16() for _ in range(layers)]
    qs = [torch.randn(rows, H, D, generator=gen).bfloat16() for _ in range(layers)]
    out = torch.empty(rows, H, D, dtype=torch.bfloat16)
    fn = load_library().paged_decode_window_bf16
    shape = (rows, H, KVH, D, slots, BLOCK, width, D**-0.5, 0, 0.0, None, threads)
    times = []
    for _ in range(reps + 1):  # the first pass warms up
        t = time.perf_counter()
        for q, kv in zip(qs, caches, strict=True):
            fn(q.data_ptr(), kv.data_ptr(), tables.data_ptr(), ctx.data_ptr(), out.data_ptr(), *shape)
        times.append(time.perf_counter() - t)
    ms = 1000 * statistics.median(times[1:])
    kv_bytes = layers * sum(lens) * KVH * D * 2 * 2  # K and V rows, bf16
    return {"rows": rows, "ms": ms, "gb_per_s": kv_bytes / ms / 1e6, "tokens": sum(lens)}


def run_child(tree: Path, args: argparse.Namespace) -> list[dict]:
    """measure() for each row count in a fresh process with `tree`'s engine first on the path."""
    from benchmarks.common import in_checkout

    cmd = ["--child", "--rows", args.rows, "--layers", str(args.layers), "--reps", str(args.reps)]
    cmd += ["--threads", str(args.threads)] + ["--shuffle"] * args.shuffle
    return in_checkout(tree, __file__, cmd)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="16,40,64")
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--reps", type=int, default=10, help="passes over the layers timed per round")
    ap.add_argument("--rounds", type=int, default=3, help="fresh processes per checkout, alternating")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shuffle", action="store_true", help="blocks handed out in a random order")
    ap.add_argument("--against", action="append", default=[], metavar="LABEL=PATH")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--smoke", action="store_true", help="rows 4, 2 layers, one round")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.child:
        for rows in map(int, args.rows.split(",")):
            print(json.dumps(measure(rows, args.layers, args.reps, args.threads, args.shuffle)), flush=True)
        return
    sys.path.insert(0, str(REPO))
    from benchmarks.common import checkouts, done, machine, out_dir

    if args.smoke:
        args.rows, args.layers, args.reps, args.rounds = "4", 2, 2, 1
    trees = checkouts(args.against)
    runs: dict[str, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in range(args.rounds):
        for label, tree in trees.items():
            for x in run_child(tree, args):
                runs[label][x["rows"]].append(x)
            print(
                f"round {r} {label}: "
                + ", ".join(f"{n} rows {xs[-1]['ms']:.2f} ms" for n, xs in runs[label].items())
            )
    result = {"machine": machine(), "args": {k: str(v) for k, v in vars(args).items()}, "trees": {}}
    for label, by_rows in runs.items():
        result["trees"][label] = {
            str(n): {
                "ms": statistics.median(x["ms"] for x in xs),
                "ms_rounds": [x["ms"] for x in xs],
                "gb_per_s": statistics.median(x["gb_per_s"] for x in xs),
            }
            for n, xs in sorted(by_rows.items())
        }
    this = result["trees"]["this"]
    for n, res in this.items():
        ratios = "".join(
            f"; {label} {t[n]['ms']:.2f} ms ({label} / this {t[n]['ms'] / res['ms']:.2f}x)"
            for label, t in result["trees"].items()
            if label != "this"
        )
        print(f"{n} rows, {args.layers} layers: this {res['ms']:.2f} ms ({res['gb_per_s']:.1f} GB/s){ratios}")
    out = out_dir(args, "decode_attention")
    (out / "decode_attention.json").write_text(json.dumps(result, indent=1))
    plot(result, out / "decode_attention.png")
    done(out)


def plot(result: dict, path: Path) -> None:
    """ms per pass over the layers, one bar per checkout, grouped by row count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks.common import grouped_bars

    trees = result["trees"]
    rows = list(trees["this"])
    fig, ax = plt.subplots(figsize=(5, 3.4))
    grouped_bars(
        ax,
        [f"{n} rows" for n in rows],
        {label: [t[n]["ms"] for n in rows] for label, t in trees.items()},
        fontsize=8,
    )
    ax.set_ylabel(f"ms per {result['args']['layers']} layers' calls")
    ax.set_title("bf16 paged decode kernel (median of rounds)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
