"""bf16 linears on the CPU as a decode step runs them: SmolLM2-135M's 30 layers of projections and
its LM head (each weight its own copy, 212 MB + 57 MB, read in the model's order, so weights come
from memory as in a step), at several row counts, for each kernel the CPU has: oneDNN over its
packed copy (torch.ops.mkldnn._linear_pointwise, where torch's oneDNN packs bf16; elsewhere torch's
F.linear), bf16_amx.c's AMX tiles and bf16_linear.c's kernel over the panels (`vdpbf16ps`, or
its AVX2 variant on CPUs without AVX512-BF16). Per shape: ms per call (median over
steps of the mean over its 30 layers) and GB/s of weight read; also the per-call cost of a tiny
linear (16 x 32, cache-hot), what a call costs beyond its weight.

Kernels and steps interleave (one step of each kernel in turn), so a busy machine slows them alike.
Writes bf16_linear.json and bf16_linear.png.

    nice -n 19 python -m benchmarks.bf16_linear [--rows 16,40,64] [--steps 10] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections import defaultdict

import torch

from benchmarks.common import add_common_args, done, machine, out_dir
from engine.device import cpu_flags
from engine.models.linear import Linear

# SmolLM2-135M: hidden 576, intermediate 1536, 9 query heads and 3 KV heads of 64, vocabulary 49152
SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}
LM_HEAD = (49152, 576)


def kernels(layer: Linear) -> dict:
    """name -> call(x) for each kernel that runs this layer on this CPU."""
    out: dict = {}
    if layer.packed is not None:
        out["oneDNN"] = lambda x: torch.ops.mkldnn._linear_pointwise(x, layer.packed, None, "none", [], "")
    else:  # oneDNN packs no bf16 here (AVX2): torch's matmul, over a plain copy of the weight
        weight = layer.weight.clone()
        out["torch F.linear"] = lambda x: torch.nn.functional.linear(x, weight)
    bf16 = layer.bf16
    if bf16 is not None and bf16.lib.bf16_amx_available():
        out["AMX (bf16_amx.c)"] = lambda x: bf16.run(x, amx=True)
    if bf16 is not None:
        isa = "vdpbf16ps" if "avx512_bf16" in cpu_flags() else "AVX2"
        out[f"{isa} (bf16_linear.c)"] = lambda x: bf16.run(x, amx=False)
    return out


def model(layers: int, shapes: dict, lm_head: tuple | None) -> list[tuple[str, int, dict]]:
    """(shape name, weight bytes, kernels) for each linear of a step, in the model's order."""
    out = []
    plan = [name for _ in range(layers) for name in shapes] + (["lm_head"] * (lm_head is not None))
    for name in plan:
        N, K = shapes.get(name, lm_head)
        layer = Linear(torch.randn(N, K).bfloat16() / K**0.5, cpu_amx=True)
        out.append((name, N * K * 2, kernels(layer)))
    return out


def per_call_us(repeats: int) -> dict:
    layer = Linear(torch.randn(32, 32).bfloat16(), cpu_amx=True)
    x = torch.randn(16, 32).bfloat16()
    out = {}
    for name, fn in kernels(layer).items():
        for _ in range(10):
            fn(x)
        t = time.perf_counter()
        for _ in range(repeats):
            fn(x)
        out[name] = 1e6 * (time.perf_counter() - t) / repeats
    return out


def measure(linears: list, M: int, K_of: dict, steps: int, clock=time.perf_counter) -> dict:
    """kernel -> shape -> (ms per call, GB/s) at M rows."""
    xs = {K: torch.randn(M, K).bfloat16() for K in set(K_of.values())}
    names = list(linears[0][2])
    times: dict = {k: defaultdict(list) for k in names}
    for step in range(steps + 1):  # the first: warm-up
        for kernel in names:
            per: dict = defaultdict(float)
            for shape, _, calls in linears:
                x = xs[K_of[shape]]
                t = clock()
                calls[kernel](x)
                per[shape] += clock() - t
            for shape, s in per.items():
                if step:
                    times[kernel][shape].append(s)
    count = defaultdict(int)
    size = {}
    for shape, nbytes, _ in linears:
        count[shape] += 1
        size[shape] = nbytes
    out: dict = {}
    for kernel in names:
        out[kernel] = {}
        for shape, ts in times[kernel].items():
            s = statistics.median(ts) / count[shape]
            out[kernel][shape] = {"ms": 1e3 * s, "GB/s": size[shape] / s / 1e9}
        total = sum(statistics.median(ts) for ts in times[kernel].values())
        nbytes = sum(size[sh] * count[sh] for sh in count)
        out[kernel]["step"] = {"ms": 1e3 * total, "GB/s": nbytes / total / 1e9}
    return out


def plot(report: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"]
    first = report["runs"][str(rows[0])]
    shapes = list(next(iter(first.values()))) if first else ["step"]  # no kernel: an empty panel
    fig, axes = plt.subplots(1, len(shapes), figsize=(3.4 * len(shapes), 3.4), squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        for kernel in first:
            ax.plot(
                rows, [report["runs"][str(m)][kernel][shape]["GB/s"] for m in rows], marker="o", label=kernel
            )
        ax.set(title=shape, xlabel="rows (M)", ylabel="GB/s of weight read", ylim=(0, None))
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"bf16 linears of a SmolLM2-135M decode step ({report['threads']} threads)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(ap)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", default="16,40,64")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--cpu-time", action="store_true", help="the calling thread's CPU time (at 1 thread)")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    out = out_dir(args, "bf16_linear")
    shapes = {"qkv": (96, 64), "down": (64, 128)} if args.smoke else SHAPES
    lm_head = (512, 64) if args.smoke else LM_HEAD
    layers, steps = (2, 1) if args.smoke else (30, args.steps)
    rows = [4, 16] if args.smoke else [int(m) for m in args.rows.split(",")]
    linears = model(layers, shapes, lm_head)
    K_of = {**{name: K for name, (_, K) in shapes.items()}, "lm_head": lm_head[1]}
    report: dict = {"machine": machine(), "threads": args.threads, "rows": rows, "steps": steps}
    report["loadavg_before"] = os.getloadavg()
    report["per_call_us"] = per_call_us(20 if args.smoke else 2000)
    print("per call (16 x 32 x 32, us):", {k: round(v, 1) for k, v in report["per_call_us"].items()})
    report["runs"] = {}
    for M in rows:
        report["runs"][str(M)] = run = measure(
            linears, M, K_of, steps, time.thread_time if args.cpu_time else time.perf_counter
        )
        for kernel, per in run.items():
            print(
                f"M={M} {kernel}:",
                ", ".join(f"{s} {v['ms']:.3f} ms {v['GB/s']:.1f} GB/s" for s, v in per.items()),
            )
    report["loadavg_after"] = os.getloadavg()
    (out / "bf16_linear.json").write_text(json.dumps(report, indent=2))
    plot(report, out / "bf16_linear.png")
    done(out)


if __name__ == "__main__":
    main()
