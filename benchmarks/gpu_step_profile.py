"""Where a GPU decode step's wall time goes, against its memory-bandwidth bound: the host parts of
the engine's step (scheduler, staging, the batch's preparation and forward launch, the LM head,
sampling with its one read-back, output processing, bookkeeping) timed by wrapping each function,
the GPU time of the forward and of LM head + sampling by CUDA events (no extra synchronisation),
and a torch.profiler table of a few steps (`--trace`).

    python3 -m benchmarks.gpu_step_profile                  # 1B and 8B shapes, batch 1 and 64, context 512
    python3 -m benchmarks.gpu_step_profile --smoke      # the logic on the CPU, a tiny model, seconds

Writes gpu_step_profile.json and .png (and the profiler tables) under --out (benchmarks/results).
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import statistics
import time
from collections import defaultdict
from pathlib import Path

import torch

from benchmarks.common import add_common_args, done, out_dir
from benchmarks.gpu import MAX_MODEL_LEN, SHAPES, sizes
from engine import LLM, SamplingParams

PARTS = {  # part -> (object path on the engine, method)
    "schedule": ("scheduler", "schedule"),
    "stage": ("runner", "stage"),
    "forward": ("runner", "forward"),
    "lm_head": ("runner.model", "logits"),
    "sample": ("runner", "_sample"),
    "finish_step": ("scheduler", "finish_step"),
    "record_step": ("stats", "record_step"),
    "process": ("output", "process"),
}


def instrument(eng, times: dict[str, list[float]], events: dict[str, list]) -> None:
    """Wrap each part's method on its instance: host seconds per call (inclusive), and CUDA events
    around the forward and around LM head + sampling where the device is a GPU."""
    cuda = eng.runner.device.type == "cuda"
    for part, (path, name) in PARTS.items():
        obj = eng
        for attr in path.split("."):
            obj = getattr(obj, attr)
        fn = getattr(obj, name)

        def timed(*a, _fn=fn, _part=part, **kw):
            if cuda and _part in ("forward", "lm_head"):
                start = torch.cuda.Event(enable_timing=True)
                start.record()
                events[_part].append(start)
            t = time.perf_counter()
            out = _fn(*a, **kw)
            times[_part].append(time.perf_counter() - t)
            if cuda and _part in ("forward", "sample"):
                end = torch.cuda.Event(enable_timing=True)
                end.record()
                events[_part + "_end"].append(end)
            return out

        setattr(obj, name, functools.wraps(fn)(timed))


def profile(llm: LLM, batch: int, context: int, steps: int, vocab: int, trace: Path | None) -> dict:
    eng, rng = llm.engine, random.Random(batch)
    params = SamplingParams(max_tokens=steps + 8, temperature=0, ignore_eos=True)
    for i in range(batch):
        eng.add_request(f"p{batch}-{i}", [rng.randrange(2, vocab) for _ in range(context)], params)
    while not all(s.num_output_tokens > 0 for s in eng.seqs.values()):
        eng.step()
    for _ in range(3):
        eng.step()
    times: dict[str, list[float]] = defaultdict(list)
    events: dict[str, list] = defaultdict(list)
    instrument(eng, times, events)
    walls = []
    for _ in range(steps):
        t = time.perf_counter()
        eng.step()
        walls.append(time.perf_counter() - t)
    row: dict = {"batch": batch, "context": context, "step_ms": statistics.median(walls) * 1e3}
    row["host_ms"] = {p: statistics.median(v) * 1e3 for p, v in times.items()}
    if events:
        torch.cuda.synchronize()
        fwd = [s.elapsed_time(e) for s, e in zip(events["forward"], events["forward_end"], strict=True)]
        head = [s.elapsed_time(e) for s, e in zip(events["lm_head"], events["sample_end"], strict=True)]
        row["gpu_ms"] = {"forward": statistics.median(fwd), "lm_head_and_sample": statistics.median(head)}
    if trace is not None and eng.runner.device.type == "cuda":
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile

        with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                eng.step()
        table = prof.key_averages()
        trace.write_text(
            table.table(sort_by="self_cuda_time_total", row_limit=40)
            + "\n"
            + table.table(sort_by="self_cpu_time_total", row_limit=25)
        )
    for seq_id in list(eng.seqs):
        eng.abort(seq_id)
    return row


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="1b,8b")
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--trace", action="store_true", help="a torch.profiler table per (model, batch)")
    add_common_args(ap)
    args = ap.parse_args(argv)
    if args.smoke:
        args.device, args.models, args.batches, args.steps = "cpu", "tiny", "1,4", 5
    out = out_dir(args, "gpu_step_profile")
    cuda = args.device.startswith("cuda")
    dtype = torch.bfloat16 if cuda else torch.float32
    result: dict = {"device": torch.cuda.get_device_name() if cuda else "cpu", "rows": []}
    batches = [int(b) for b in args.batches.split(",")]
    for name in args.models.split(","):
        shape = SHAPES[name]
        weight_bytes, kv_per_token = sizes(shape, dtype)
        llm = LLM(
            model="dummy",
            dummy_config=shape,
            device=args.device,
            dtype="bfloat16" if cuda else "float32",
            kv_cache_gib=8 if cuda else 0.05,
            max_num_seqs=max(batches),
            max_model_len=MAX_MODEL_LEN if cuda else args.context + args.steps + 64,  # gpu.py's
        )
        for batch in batches:
            trace = out / f"gpu_step_profile_{name}_b{batch}.txt" if args.trace else None
            row = profile(llm, batch, args.context, args.steps, shape["vocab_size"], trace)
            row["model"] = name
            row["weight_bytes"] = weight_bytes
            row["kv_bytes"] = batch * args.context * kv_per_token
            result["rows"].append(row)
            gpu = row.get("gpu_ms", {})
            host = ", ".join(f"{p} {ms:.3f}" for p, ms in sorted(row["host_ms"].items(), key=lambda x: -x[1]))
            print(f"{name} batch {batch}: step {row['step_ms']:.3f} ms; gpu {gpu}; host {host}", flush=True)
        del llm
        if cuda:
            torch.cuda.empty_cache()
    (out / "gpu_step_profile.json").write_text(json.dumps(result, indent=1))
    plot(result, out / "gpu_step_profile.png")
    done(out)


def plot(result: dict, path: Path) -> None:
    """Per (model, batch): the step's wall time beside its host parts, stacked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    labels = [f"{r['model']} b{r['batch']}" for r in rows]
    bottom = [0.0] * len(rows)
    for part in PARTS:
        ms = [r["host_ms"].get(part, 0.0) for r in rows]
        ax.bar(labels, ms, bottom=bottom, label=part)
        bottom = [b + m for b, m in zip(bottom, ms, strict=True)]
    ax.plot(labels, [r["step_ms"] for r in rows], "k_", markersize=30, label="step (wall)")
    ax.set_ylabel("ms (host time per part, inclusive)")
    ax.set_title(f"decode step parts, {result['device']}")
    ax.legend(fontsize=6, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
