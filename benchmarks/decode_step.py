"""A batched decode step of SmolLM2 in bf16 on the CPU (AMX linears where the CPU has them, the
per-operator forward), at 16, 40 and 64 rows over contexts of 100-600 tokens (what
benchmarks/throughput.py's long-tailed workload sees): the step's time and where it goes, and the
same step of other checkouts side by side.

    python3 -m benchmarks.decode_step                          # this tree, rows 16, 40, 64, 2 threads
    python3 -m benchmarks.decode_step --against old=/tmp/old   # and another checkout, interleaved
    python3 -m benchmarks.decode_step --torch-profile          # also torch.profiler's ops (shapes)
    python3 -m benchmarks.decode_step --temperature 1          # sampled rows (no seed), not greedy
    python3 -m benchmarks.decode_step --smoke                  # a tiny random model, seconds

Each (checkout, round) runs in a fresh process with that checkout first on PYTHONPATH; rounds
alternate the checkouts, so a busy machine slows them alike, and ratios are of medians over
rounds. Parts are timed by wrapping the engine's functions (exclusive wall time, this tree's
names; `cpu` with --cpu-time: the calling thread's CPU time, steadier on a shared machine at one
thread): the linears (oneDNN or the C kernel), the attention kernel, the K/V writes, RMSNorm,
RoPE, SiLU·mul, the LM head, sampling, the batch's preparation, and the rest (the forward's Python
and small torch ops, the step's bookkeeping). Beside the step's wall time, its CPU time (the
process's, all threads; at --threads 1 the step's work, whatever else runs on the machine).
Writes decode_step.json under --out.
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


def measure(
    rows: int,
    steps: int,
    threads: int,
    model: str,
    cpu_time: bool,
    torch_profile: bool,
    temperature: float = 0.0,
) -> dict:
    """Per-step ms of decode steps of `rows` sequences (median, and each part's mean)."""
    import torch

    from benchmarks.profile_step import Timer
    from engine import LLM, SamplingParams

    torch.set_num_threads(threads)
    llm = LLM(model=model, dtype="bfloat16", num_threads=threads, max_num_seqs=max(rows, 8))
    eng, rng = llm.engine, random.Random(rows)
    vocab = llm.engine.runner.model.embed.shape[0]
    params = SamplingParams(max_tokens=steps + 32, temperature=temperature, ignore_eos=True)
    for i in range(rows):
        prompt = [rng.randrange(100, vocab - 1) for _ in range(rng.randrange(100, 600))]
        eng.add_request(f"d{i}", prompt, params)
    while not all(s.num_output_tokens > 0 for s in eng.seqs.values()):
        eng.step()
    for _ in range(2):
        eng.step()
    timer = Timer(time.thread_time if cpu_time else time.perf_counter)
    walls, cpus = [], []
    with wrapped(eng, timer):
        for _ in range(steps):
            t, c = time.perf_counter(), time.process_time()
            eng.step()
            walls.append(time.perf_counter() - t)
            cpus.append(time.process_time() - c)
    out = {
        "rows": rows,
        "step_ms": 1000 * statistics.median(walls),
        "step_cpu_ms": 1000 * statistics.median(cpus),
        "parts_ms": {k: 1000 * v / steps for k, v in sorted(timer.seconds.items())},
    }
    if torch_profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            for _ in range(4):
                eng.step()
        table = prof.key_averages(group_by_input_shape=True)
        print(
            table.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=36),
            file=sys.stderr,
        )
    return out


class wrapped:
    """The step's parts wrapped in `timer` while inside the block (whatever this tree names them)."""

    def __init__(self, eng, timer) -> None:
        import engine.model_runner as runner_mod
        from engine.models.fused import CPUOps, TorchOps
        from engine.models.linear import Linear

        model, attn = eng.runner.model, eng.runner.model.attention
        self.patches = [
            (Linear, "__call__", "linears"),
            (CPUOps, "add_rms_norm", "rms_norm"),
            (CPUOps, "rope", "rope"),
            (CPUOps, "silu_mul", "silu_mul"),
            (TorchOps, "silu_mul", "silu_mul"),
            (runner_mod, "sample_ids", "sampling"),
            (runner_mod, "process_logits", "sampling"),
            (model, "logits", "lm_head"),
            (model, "forward", "rest"),
            (attn, "forward", "kv_write"),  # the forward less its kernel: the writes and their Python
            (attn, "_decode", "attention"),
            (eng.runner, "_prepare", "prepare"),
            (eng, "step", "rest"),
        ]
        self.timer, self.saved = timer, [(o, n, getattr(o, n)) for o, n, _ in self.patches]

    def __enter__(self):
        for obj, name, part in self.patches:
            setattr(obj, name, self.timer.wrap(part, getattr(obj, name)))

    def __exit__(self, *exc):
        for obj, name, fn in reversed(self.saved):
            setattr(obj, name, fn)


def run_child(tree: Path, args: argparse.Namespace) -> list[dict]:
    """measure() for each row count in a fresh process with `tree`'s engine first on the path."""
    from benchmarks.common import in_checkout

    cmd = ["--child", "--rows", args.rows, "--steps", str(args.steps), "--threads", str(args.threads)]
    cmd += ["--model", args.model, "--temperature", str(args.temperature)]
    cmd += ["--cpu-time"] * args.cpu_time + ["--torch-profile"] * args.torch_profile
    return in_checkout(tree, __file__, cmd, echo_stderr=args.torch_profile)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="16,40,64")
    ap.add_argument("--steps", type=int, default=12, help="decode steps timed per row count and round")
    ap.add_argument("--rounds", type=int, default=3, help="fresh processes per checkout, alternating")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--against", action="append", default=[], metavar="LABEL=PATH")
    ap.add_argument("--temperature", type=float, default=0.0, help="every row's (0: greedy); no seed")
    ap.add_argument("--cpu-time", action="store_true", help="parts in the calling thread's CPU time")
    ap.add_argument("--torch-profile", action="store_true", help="print torch.profiler's ops (shapes)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--smoke", action="store_true", help="a tiny random model, rows 4 and 8, one round")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.child:
        import engine  # noqa: F401  the checkout's engine (first on PYTHONPATH), then this tree's benchmarks

        sys.path.insert(0, str(REPO))
        for rows in map(int, args.rows.split(",")):
            m = measure(
                rows,
                args.steps,
                args.threads,
                args.model,
                args.cpu_time,
                args.torch_profile,
                args.temperature,
            )
            print(json.dumps(m), flush=True)
        return
    sys.path.insert(0, str(REPO))
    from benchmarks.common import checkouts, done, machine, out_dir, tiny_model

    if args.smoke:
        args.rows, args.steps, args.rounds, args.model = "4,8", 3, 1, tiny_model()
    trees = checkouts(args.against)
    runs: dict[str, list[list[dict]]] = defaultdict(list)
    for r in range(args.rounds):
        for label, tree in trees.items():
            runs[label].append(run_child(tree, args))
            print(
                f"round {r} {label}: "
                + ", ".join(f"{x['rows']} rows {x['step_ms']:.1f} ms" for x in runs[label][-1])
            )
    result = {"machine": machine(), "args": {k: str(v) for k, v in vars(args).items()}, "trees": {}}
    for label, rounds in runs.items():
        by_rows: dict[int, list[dict]] = defaultdict(list)
        for row in (x for rnd in rounds for x in rnd):
            by_rows[row["rows"]].append(row)
        result["trees"][label] = {
            str(n): {
                "step_ms": statistics.median(x["step_ms"] for x in xs),
                "step_ms_rounds": [x["step_ms"] for x in xs],
                "step_cpu_ms": statistics.median(x.get("step_cpu_ms", 0.0) for x in xs),
                "parts_ms": {
                    p: statistics.median(x["parts_ms"].get(p, 0.0) for x in xs) for p in xs[0]["parts_ms"]
                },
            }
            for n, xs in sorted(by_rows.items())
        }
    this = result["trees"]["this"]
    for n, res in this.items():
        parts = ", ".join(f"{p} {ms:.2f}" for p, ms in sorted(res["parts_ms"].items(), key=lambda kv: -kv[1]))
        ratios = "".join(
            f"; {label} {t[n]['step_ms']:.1f} ms (this / {label} {res['step_ms'] / t[n]['step_ms']:.3f}),"
            f" CPU {t[n]['step_cpu_ms']:.1f} ms"
            f" (this / {label} {res['step_cpu_ms'] / t[n]['step_cpu_ms']:.3f})"
            for label, t in result["trees"].items()
            if label != "this"
        )
        print(f"{n} rows: this {res['step_ms']:.1f} ms, CPU {res['step_cpu_ms']:.1f} ms{ratios}")
        print(f"  parts (ms/step): {parts}")
    out = out_dir(args, "decode_step")
    (out / "decode_step.json").write_text(json.dumps(result, indent=1))
    plot(result, out / "decode_step.png")
    done(out)


def plot(result: dict, path: Path) -> None:
    """Stacked ms per decode step by part, one bar per checkout, a panel per row count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    trees = result["trees"]
    labels = list(trees)
    rows = list(trees["this"])
    parts = sorted({p for t in trees.values() for r in t.values() for p in r["parts_ms"]})
    fig, axes = plt.subplots(1, len(rows), figsize=(3.4 * len(rows), 3.6), squeeze=False)
    for ax, n in zip(axes[0], rows, strict=True):
        bottom = [0.0] * len(labels)
        for part in parts:
            ms = [trees[t][n]["parts_ms"].get(part, 0.0) for t in labels]
            ax.bar(labels, ms, bottom=bottom, label=part)
            bottom = [b + m for b, m in zip(bottom, ms, strict=True)]
        ax.plot(labels, [trees[t][n]["step_ms"] for t in labels], "k_", markersize=30, label="step")
        ax.set_title(f"{n} rows")
        ax.set_ylabel("ms / decode step")
    axes[0][-1].legend(fontsize=6)
    fig.suptitle("decode step by part (median of rounds)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
