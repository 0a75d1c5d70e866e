"""The INT8 linear's two CPU kernels against the bf16 one, per call, side by side in one run:
`csrc/int8_linear.c` (where the CPU lacks AVX512-VNNI), `csrc/int8_vnni.c` (where it has it) and
`csrc/bf16_linear.c` (AVX512-BF16), on SmolLM2-135M's projection shapes at several batch sizes.

Each kernel is called through ctypes on the same fp32 input (bf16 for the bf16 kernel), the three
interleaved call by call; the fastest of `--repeats` calls counts (the JSON also has the median): on
a shared host other jobs only add time, and a descheduled OpenMP thread adds milliseconds.
Writes int8_linear.json and int8_linear.png.

    nice -n 19 python -m benchmarks.int8_linear
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from benchmarks.common import add_common_args, done, machine, out_dir
from engine.models import bf16_linear, quant

# SmolLM2-135M: hidden 576, intermediate 1536, 9 query heads and 3 KV heads of 64
SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}
ROWS = (1, 8, 32, 48, 128)


def _kernels(N: int, K: int, M: int, threads: int) -> dict:
    """name -> a no-argument call of that kernel on one [M, K] input (None where the CPU lacks it)."""
    w = torch.randn(N, K) / K**0.5
    layer = quant.Int8Linear(w)
    grouped = quant.pack(layer.rows)  # int8_linear.c's layout (the layer holds the VNNI panels)
    x = torch.randn(M, K)
    y = torch.empty(M, N)

    def args() -> tuple:  # y read here: the closures keep it alive
        return (layer.scale.data_ptr(), None, y.data_ptr(), M, N, K, threads)

    calls: dict = {
        "int8 (int8_linear.c)": lambda: layer.lib.int8_linear_f32(x.data_ptr(), grouped.data_ptr(), *args())
    }
    if layer.vnni is not None:
        calls["int8 (int8_vnni.c)"] = lambda: layer.vnni.int8_vnni_linear_f32(
            x.data_ptr(), layer.qweight.data_ptr(), *args()
        )
    bf16 = bf16_linear.BF16Panels.make(w.bfloat16(), None)
    if bf16 is not None:
        xb = x.bfloat16()
        calls["bf16 (bf16_linear.c)"] = lambda: bf16(xb)
    return calls


def measure(N: int, K: int, M: int, threads: int, repeats: int) -> dict:
    """name -> {"min": , "median": } milliseconds per call."""
    calls = _kernels(N, K, M, threads)
    times: dict = {name: [] for name in calls}
    for fn in calls.values():
        for _ in range(3):
            fn()  # warm-up: the library loaded, the weight in cache as far as it fits
    for _ in range(repeats):
        for name, fn in calls.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return {name: {"min": 1e3 * min(ts), "median": 1e3 * statistics.median(ts)} for name, ts in times.items()}


def plot(report: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = list(report["shapes"])
    fig, axes = plt.subplots(1, len(shapes), figsize=(4 * len(shapes), 3.6), squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        runs = report["shapes"][shape]["ms"]
        for name in runs[str(ROWS[0])]:
            ax.plot(ROWS, [runs[str(m)][name]["min"] for m in ROWS], marker="o", label=name)
        N, K = report["shapes"][shape]["N"], report["shapes"][shape]["K"]
        ax.set(
            title=f"{shape} [{N} x {K}]",
            xlabel="rows (M)",
            ylabel="ms per call (fastest)",
            xscale="log",
            yscale="log",
        )
        ax.set_xticks(ROWS, [str(m) for m in ROWS])
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"INT8 and bf16 linears on the CPU ({report['threads']} threads)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(ap)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=50)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    out = out_dir(args, "int8_linear")
    shapes = {"qkv": (96, 64)} if args.smoke else SHAPES
    report: dict = {"machine": machine(), "threads": args.threads, "repeats": args.repeats, "shapes": {}}
    report["loadavg_before"] = os.getloadavg()
    for shape, (N, K) in shapes.items():
        runs = {str(M): measure(N, K, M, args.threads, 3 if args.smoke else args.repeats) for M in ROWS}
        report["shapes"][shape] = {"N": N, "K": K, "ms": runs}
        for M in ROWS:
            print(shape, f"M={M}", {k: round(v["min"], 4) for k, v in runs[str(M)].items()}, flush=True)
    report["loadavg_after"] = os.getloadavg()
    (out / "int8_linear.json").write_text(json.dumps(report, indent=2))
    plot(report, out / "int8_linear.png")
    done(out)


if __name__ == "__main__":
    main()
