"""One MoE layer's experts alone against the bound of the bytes they read: an OLMoE-1B-7B layer
(hidden 2048, 16 of its 64 experts of intermediate 1024, top-8) with random weights, the fp32 C
kernel's one call (engine/models/moe.py) at 1, 8 and 32 tokens.

The bound of a call is the bytes of the experts its tokens were routed to, once each, over the
machine's read bandwidth (benchmarks/bandwidth.py). A call's wall time counts the time the OS gave
the thread to other jobs on a shared host; at one thread its CPU time (`time.thread_time`) does
not, so both are reported (fastest of --calls calls). Writes moe_layer.json and moe_layer.png.

    python -m benchmarks.moe_layer --threads 1
    python -m benchmarks.moe_layer --smoke
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from benchmarks.bandwidth import read_bandwidth
from benchmarks.common import add_common_args, done, machine, out_dir
from engine.models.fused import TorchOps
from engine.models.linear import Linear
from engine.models.moe import ExpertCounter, MoEBlock
from engine.models.spec import MoESpec

SHAPE = dict(hidden=2048, intermediate=1024, experts=16, top_k=8)
SMOKE = dict(hidden=128, intermediate=64, experts=4, top_k=2)


def block(shape: dict) -> MoEBlock:
    H, inter, E = shape["hidden"], shape["intermediate"], shape["experts"]
    gen = torch.Generator().manual_seed(0)
    spec = MoESpec(num_experts=E, top_k=shape["top_k"], intermediate_size=inter, layers=(True,))
    gu = torch.randn(E, 2 * inter, H, generator=gen) * 0.02
    dn = torch.randn(E, H, inter, generator=gen) * 0.02
    router = Linear(torch.randn(E, H, generator=gen))
    return MoEBlock(spec, "silu", router, gu, dn, None, None, ExpertCounter("cpu"))


def measure(moe: MoEBlock, hidden: int, tokens: int, calls: int, threads: int) -> dict:
    """The fastest of `calls` calls over `tokens` random rows: wall and (one thread) CPU ms."""
    h = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(tokens))
    ops = TorchOps()
    wall, cpu = [], []
    for _ in range(calls + 1):  # the first call warms up
        moe.counter.reset()
        w, c = time.perf_counter(), time.thread_time()
        moe(h, ops)
        cpu.append(time.thread_time() - c)
        wall.append(time.perf_counter() - w)
    row = {"wall_ms": 1000 * min(wall[1:]), "experts": moe.counter.value()}
    if threads == 1:  # at more threads the others' CPU time is not the caller's
        row["cpu_ms"] = 1000 * min(cpu[1:])
    row["bytes"] = row["experts"] * moe.expert_bytes
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--calls", type=int, default=20, help="calls per token count (the fastest counts)")
    add_common_args(ap)
    args = ap.parse_args()
    out = out_dir(args, "moe_layer")
    torch.set_num_threads(args.threads)
    shape, sizes = (SMOKE, [1, 2]) if args.smoke else (SHAPE, [1, 8, 32])
    moe = block(shape)
    if moe.panels is None:
        raise SystemExit("the fp32 C kernel did not build (no C compiler?): nothing to measure")
    rows = {n: measure(moe, shape["hidden"], n, 2 if args.smoke else args.calls, args.threads) for n in sizes}
    bandwidth = read_bandwidth(args.threads, gib=0.25 if args.smoke else 1.0)
    for row in rows.values():
        row["bound_ms"] = 1000 * row["bytes"] / bandwidth
        for k in ("wall", "cpu"):
            if f"{k}_ms" in row:
                row[f"fraction_of_bound_{k}"] = row["bound_ms"] / row[f"{k}_ms"]
    report = dict(shape=shape, threads=args.threads, dtype="float32", machine=machine())
    report.update(read_bandwidth_gb_s=bandwidth / 1e9, torch=torch.__version__, tokens=rows)
    (out / "moe_layer.json").write_text(json.dumps(report, indent=2))
    print("| tokens | experts | bound ms | wall ms | CPU ms | fraction (wall) | fraction (CPU) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n, r in rows.items():
        cpu = (f"{r['cpu_ms']:.2f}", f"{r['fraction_of_bound_cpu']:.2f}") if "cpu_ms" in r else ("-", "-")
        print(
            f"| {n} | {r['experts']} | {r['bound_ms']:.2f} | {r['wall_ms']:.2f} | {cpu[0]} | "
            f"{r['fraction_of_bound_wall']:.2f} | {cpu[1]} |"
        )
    print(f"read bandwidth: {bandwidth / 1e9:.1f} GB/s (benchmarks/bandwidth.py)")
    plot(rows, out / "moe_layer.png", shape, args.threads)
    done(out)


def plot(rows: dict, path: Path, shape: dict, threads: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    series = [("bound_ms", "bound (bytes read / bandwidth)"), ("wall_ms", "wall"), ("cpu_ms", "CPU time")]
    series = [(k, label) for k, label in series if all(k in r for r in rows.values())]
    width = 0.8 / len(series)
    for j, (key, label) in enumerate(series):
        ax.bar([i + j * width for i in range(len(rows))], [r[key] for r in rows.values()], width, label=label)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))], [f"{n} tokens" for n in rows])
    ax.set(
        ylabel="ms per call",
        title=f"MoE layer's experts, one C call: {shape['experts']} experts, top-{shape['top_k']}, "
        f"hidden {shape['hidden']} (fp32, {threads} thread{'s' * (threads > 1)})",
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
