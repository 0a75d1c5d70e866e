"""The paged-decode kernel (engine/kernels/paged_decode.py) alone on a GPU, by split count: its
time (median of CUDA-event timings, triton.testing.do_bench) and the bytes of K/V it reads over
that time, for the 1B (8 KV heads x 64) and 8B (8 x 128) shapes, batch 1/8/64, contexts 512 and
4,096, against the split count the engine would choose (choose_splits) at a table width of 8,192
tokens. Writes gpu_decode_splits.json under --out.

    python3 -m benchmarks.gpu_decode_splits
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import triton.testing

from engine.kernels.paged_decode import choose_splits, paged_decode

SHAPES = {"1b": (32, 8, 64), "8b": (32, 8, 128)}  # query heads, KV heads, head dim


def time_us(q, cache, tables, lens, block_size: int, splits: int) -> float:
    scale = q.shape[-1] ** -0.5

    def fn():
        return paged_decode(q, cache, tables, lens, block_size, scale, num_splits=splits)

    return float(triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")) * 1e3


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--splits", default="1,2,4,8,16,32")
    args = ap.parse_args(argv)
    dev, dtype, bs, width = torch.device("cuda"), torch.bfloat16, 16, 8192
    rows = []
    for name, (H, KVH, D) in SHAPES.items():
        for batch in (1, 8, 64):
            for ctx in (512, 4096):
                slots = batch * width
                cache = torch.randn(2, KVH, slots, D, device=dev, dtype=dtype)
                perm = torch.randperm(slots // bs, device=dev)
                tables = perm.view(batch, width // bs)
                lens = torch.full((batch,), ctx, device=dev, dtype=torch.int64)
                q = torch.randn(batch, H, D, device=dev, dtype=dtype)
                kv_bytes = 2 * batch * ctx * KVH * D * 2
                chosen = choose_splits(batch, KVH, width // bs, bs, dev)
                row = {"model": name, "batch": batch, "context": ctx, "chosen_splits": chosen, "us": {}}
                for s in sorted({*map(int, args.splits.split(",")), chosen}):
                    row["us"][s] = time_us(q, cache, tables, lens, bs, s)
                best = min(row["us"], key=row["us"].get)
                row["best_splits"], row["kv_bytes"] = best, kv_bytes
                rows.append(row)
                us = " ".join(f"{s}:{t:.1f}" for s, t in row["us"].items())
                print(
                    f"{name} b{batch} ctx{ctx}: chosen {chosen} ({row['us'][chosen]:.1f} us), best {best} "
                    f"({row['us'][best]:.1f} us, {kv_bytes / row['us'][best] / 1e3:.0f} GB/s); {us}",
                    flush=True,
                )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"device": torch.cuda.get_device_name(), "rows": rows}
    (out / "gpu_decode_splits.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
