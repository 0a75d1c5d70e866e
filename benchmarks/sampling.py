"""The sampler alone: `engine.sampler.sample_ids` over fp32 logits of rows that sample at
temperature 1 without a seed, at the vocabularies of SmolLM2 (49,152) and Qwen3 (151,936), 1, 16
and 64 rows, one torch thread, this tree and other checkouts side by side.

    python -m benchmarks.sampling                              # this tree
    python -m benchmarks.sampling --against old=/tmp/old       # and another checkout, taking turns
    python -m benchmarks.sampling --smoke                      # a small vocabulary, a few calls

Each (checkout, round) runs in a fresh process with that checkout first on PYTHONPATH; rounds
alternate the checkouts, so a busy machine slows them alike. A call's time is the median over
``--calls`` calls on the same logits (a fresh copy of the logits each call is not timed); the
result is each checkout's median over rounds. Writes sampling.json and sampling.png under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VOCABS = (49152, 151936)
ROWS = (1, 16, 64)


def measure(vocab: int, rows: int, calls: int) -> float:
    """Median ms of one sample_ids call over `rows` rows of `vocab` logits."""
    import torch

    from engine.request import SamplingParams
    from engine.sampler import sample_ids

    torch.manual_seed(vocab + rows)
    logits = torch.randn(rows, vocab) * 3
    params, generators = [SamplingParams(temperature=1.0)] * rows, [None] * rows
    times = []
    for i in range(calls + 3):
        batch = logits.clone()
        start = time.perf_counter()
        sample_ids(batch, params, generators)
        if i >= 3:  # the first calls warm the allocator up
            times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def run_child(tree: Path, args: argparse.Namespace) -> dict:
    """measure() for each case in a fresh process with `tree`'s engine first on the path."""
    from benchmarks.common import in_checkout

    cmd = ["--child", "--calls", str(args.calls), "--vocabs", args.vocabs, "--rows", args.rows]
    return in_checkout(tree, __file__, cmd)[0]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocabs", default=",".join(map(str, VOCABS)))
    ap.add_argument("--rows", default=",".join(map(str, ROWS)))
    ap.add_argument("--calls", type=int, default=40, help="timed calls per (vocabulary, rows) and round")
    ap.add_argument("--rounds", type=int, default=3, help="fresh processes per checkout, alternating")
    ap.add_argument("--against", action="append", default=[], metavar="LABEL=PATH")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--smoke", action="store_true", help="vocabulary 4,096, rows 1 and 4, one round")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.child:
        import torch

        torch.set_num_threads(1)
        out = {
            f"{v}x{r}": measure(v, r, args.calls)
            for v in map(int, args.vocabs.split(","))
            for r in map(int, args.rows.split(","))
        }
        print(json.dumps(out), flush=True)
        return
    sys.path.insert(0, str(REPO))
    from benchmarks.common import checkouts, done, machine, out_dir

    if args.smoke:
        args.vocabs, args.rows, args.calls, args.rounds = "4096", "1,4", 3, 1
    trees = checkouts(args.against)
    runs: dict[str, list[dict]] = defaultdict(list)
    for r in range(args.rounds):
        for label, tree in trees.items():
            runs[label].append(run_child(tree, args))
            print(f"round {r} {label}: " + ", ".join(f"{k} {ms:.3f} ms" for k, ms in runs[label][-1].items()))
    result = {
        "machine": machine(),
        "load_average_1_5_15_end": list(os.getloadavg()),
        "args": {k: str(v) for k, v in vars(args).items()},
        "ms": {
            label: {k: statistics.median(rnd[k] for rnd in rounds) for k in rounds[0]}
            for label, rounds in runs.items()
        },
        "ms_rounds": runs,
    }
    print("| vocabulary x rows | " + " | ".join(f"{label} ms" for label in trees) + " |")
    print("| --- |" + " ---: |" * len(trees))
    for key, ms in result["ms"]["this"].items():
        cells = [f"{result['ms'][label][key]:.3f}" for label in trees]
        ratios = "".join(
            f" (this / {label} {ms / result['ms'][label][key]:.2f})" for label in trees if label != "this"
        )
        print(f"| {key} | " + " | ".join(cells) + f" |{ratios}")
    out = out_dir(args, "sampling")
    (out / "sampling.json").write_text(json.dumps(result, indent=1))
    plot(result, out / "sampling.png")
    done(out)


def plot(result: dict, path: Path) -> None:
    """ms per sample_ids call, a bar per checkout and case (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks.common import grouped_bars

    labels = list(result["ms"])
    cases = list(result["ms"]["this"])
    fig, ax = plt.subplots(figsize=(1.2 + 1.1 * len(cases), 3.6))
    grouped_bars(ax, cases, {label: [result["ms"][label][c] for c in cases] for label in labels})
    ax.set_yscale("log")
    ax.set_ylabel("ms per sample_ids call")
    ax.set_title("unseeded sampling, temperature 1, one thread (median of rounds)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
