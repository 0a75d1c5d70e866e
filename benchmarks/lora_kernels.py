"""The batched LoRA kernels alone (engine/lora/kernels): microseconds per projection of the triton
SGMV kernels (split-K shrink + expand) against the torch segment kernel, at an 8B's projections.

    python -m benchmarks.lora_kernels              # on a CUDA GPU: bf16 model, fp32 adapters
    python -m benchmarks.lora_kernels --smoke      # tiny shapes, seconds, any device

Steps: decodes of 1, 16 and 64 rows over 1, 4 and 16 adapters (rank 16) and one 2048-row prefill
chunk of one adapter. Each case reports the median time of an `apply` (CUDA events on a GPU) and
the adapter bytes it reads (A and B of the step's slots) over that time. The triton kernel runs on
CUDA only (elsewhere it would be Triton's interpreter). Writes lora_kernels.json to --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import done
from engine.lora.kernels import Segment, make_kernel

RESULTS = Path(__file__).parent / "results"
# (name, in, out, m): Llama-3-8B's fused qkv (q 4096 + k, v 1024 each), gate/up and down; the
# slots hold B as [m, out] per rank (engine/lora/slots.py)
SHAPES = (("qkv", 4096, 6144, 3), ("gate_up", 4096, 28672, 2), ("down", 14336, 4096, 1))
STEPS = ((1, 1), (16, 1), (16, 4), (64, 4), (64, 16), (2048, 1))  # (rows, adapters)
RANK = 16


def time_apply(kernel, y, x, a, b, meta, device: torch.device, reps: int) -> float:
    """Median microseconds of one apply."""
    times = []
    for _ in range(reps + 3):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            kernel.apply(y, x, a, b, meta)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        else:
            t = time.perf_counter()
            kernel.apply(y, x, a, b, meta)
            times.append((time.perf_counter() - t) * 1e6)
    return statistics.median(times[3:])


def run(device: torch.device, shapes, steps, reps: int) -> list[dict]:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    kernels = ["torch", "triton"] if device.type == "cuda" else ["torch"]
    rows_out = []
    for name, in_f, out_f, m in shapes:
        a = torch.randn(16, RANK, m, in_f, device=device) / in_f**0.5
        b = torch.randn(16, RANK, m, out_f, device=device) * 0.02
        for rows, adapters in steps:
            per = rows // adapters
            segs = [Segment(i * per, (i + 1) * per, i, RANK) for i in range(adapters)]
            x = torch.randn(rows, in_f, device=device, dtype=dtype)
            y = torch.zeros(rows, out_f, device=device, dtype=dtype)
            read = adapters * RANK * m * (in_f + out_f) * 4  # fp32 A and B of the step's slots
            for kname in kernels:
                kernel = make_kernel(kname, device.type)
                meta = kernel.prepare(segs, device)
                us = time_apply(kernel, y, x, a, b, meta, device, reps)
                rows_out.append(
                    {"projection": name, "in": in_f, "out": out_f, "rows": rows, "adapters": adapters,
                     "kernel": kname, "us": round(us, 2), "adapter_GBps": round(read / us / 1e3, 1)}
                )  # fmt: skip
                print(json.dumps(rows_out[-1]), flush=True)
    return rows_out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, 3 reps, temp out dir")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shapes, steps, reps = SHAPES, STEPS, args.reps
    if args.smoke:
        shapes, steps, reps = (("qkv", 256, 64, 3), ("down", 512, 128, 1)), ((1, 1), (8, 4)), 3
    out_dir = args.out or (Path(tempfile.mkdtemp(prefix="lora-kernels-")) if args.smoke else RESULTS)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = run(device, shapes, steps, reps)
    info = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "rank": RANK}
    path = out_dir / "lora_kernels.json"
    path.write_text(json.dumps({**info, "smoke": args.smoke, "results": results}, indent=1) + "\n")
    plot(results, out_dir / "lora_kernels.png", info["device"])
    done(out_dir)


def plot(results: list[dict], path: Path, device: str) -> None:
    """Microseconds per apply, one group of bars a (projection, rows, adapters), one bar a kernel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = list(dict.fromkeys((r["projection"], r["rows"], r["adapters"]) for r in results))
    kernels = list(dict.fromkeys(r["kernel"] for r in results))
    us = {(r["projection"], r["rows"], r["adapters"], r["kernel"]): r["us"] for r in results}
    fig, ax = plt.subplots(figsize=(max(6, len(cases) * 0.6), 4))
    width = 0.8 / len(kernels)
    for j, k in enumerate(kernels):
        ax.bar([i + j * width for i in range(len(cases))], [us[(*c, k)] for c in cases], width, label=k)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cases))], [f"{p} {n}r/{a}a" for p, n, a in cases])
    ax.tick_params(axis="x", rotation=60)
    ax.set_yscale("log")
    ax.set_ylabel("µs per projection")
    ax.set_title(f"LoRA kernels, rank {RANK}, {device}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
