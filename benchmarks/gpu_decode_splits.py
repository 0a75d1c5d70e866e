"""The paged-decode kernel (engine/kernels/paged_decode.py) alone on a GPU, by split count: its
time (median of CUDA-event timings, triton.testing.do_bench) and the bytes of K/V it reads over
that time, for the 1B (8 KV heads x 64) and 8B (8 x 128) shapes, batch 1/8/64, contexts 512 and
4,096, against the split count the engine would choose (choose_splits) at a table width of 8,192
tokens. At small sizes the timing holds the Python launch (tens of microseconds), not only the
kernel: read those cells against the CUDA-graph kernel times of benchmarks.gpu_step_profile.

    python3 -m benchmarks.gpu_decode_splits
    python3 -m benchmarks.gpu_decode_splits --smoke     # the CPU, triton's interpreter, one tiny cell

Writes gpu_decode_splits.json and .png under --out (benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from benchmarks.common import add_common_args, done, out_dir

SHAPES = {"1b": (32, 8, 64), "8b": (32, 8, 128)}  # query heads, KV heads, head dim


def time_us(q, cache, tables, lens, block_size: int, splits: int) -> float:
    from engine.kernels.paged_decode import paged_decode

    scale = q.shape[-1] ** -0.5

    def fn():
        return paged_decode(q, cache, tables, lens, block_size, scale, num_splits=splits)

    if q.device.type != "cuda":  # the interpreter: one timed call
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e6
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")) * 1e3


def plot(rows: list[dict], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.5))
    for row in rows:
        splits = sorted(row["us"], key=int)
        ax.plot([int(s) for s in splits], [row["us"][s] for s in splits], marker="o", label=row["cell"])
    ax.set_xscale("log", base=2)
    ax.set_xlabel("splits")
    ax.set_ylabel("us per call")
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--splits", default="1,2,4,8,16,32")
    add_common_args(ap)
    args = ap.parse_args(argv)
    if args.smoke and not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"  # read when the kernels are defined: before their import
    from engine.kernels.paged_decode import choose_splits

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype, bs, width = (torch.bfloat16, 16, 8192) if dev.type == "cuda" else (torch.float32, 16, 128)
    shapes = {"tiny": (4, 2, 16)} if args.smoke else SHAPES
    cells = [(1, 64)] if args.smoke else [(b, c) for b in (1, 8, 64) for c in (512, 4096)]
    splits_asked = [1, 2] if args.smoke else [int(s) for s in args.splits.split(",")]
    rows = []
    for name, (H, KVH, D) in shapes.items():
        for batch, ctx in cells:
            slots = batch * width
            cache = torch.randn(2, KVH, slots, D, device=dev, dtype=dtype)
            tables = torch.randperm(slots // bs, device=dev).view(batch, width // bs)
            lens = torch.full((batch,), ctx, device=dev, dtype=torch.int64)
            q = torch.randn(batch, H, D, device=dev, dtype=dtype)
            kv_bytes = 2 * batch * ctx * KVH * D * dtype.itemsize
            chosen = choose_splits(batch, KVH, width // bs, bs, dev)
            us = {str(s): time_us(q, cache, tables, lens, bs, s) for s in sorted({*splits_asked, chosen})}
            best = min(us, key=lambda s: us[s])
            cell = f"{name} b{batch} ctx{ctx}"
            rows.append(
                dict(cell=cell, chosen_splits=chosen, best_splits=int(best), kv_bytes=kv_bytes, us=us)
            )
            times = " ".join(f"{s}:{t:.1f}" for s, t in us.items())
            picked = f"chosen {chosen} ({us[str(chosen)]:.1f} us), best {best} ({us[best]:.1f} us)"
            print(f"{cell}: {picked}; {times}")
    out = out_dir(args, "gpu_decode_splits")
    name = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu (interpreter)"
    (out / "gpu_decode_splits.json").write_text(json.dumps({"device": name, "rows": rows}, indent=1))
    plot(rows, out / "gpu_decode_splits.png")
    done(out)


if __name__ == "__main__":
    main()
