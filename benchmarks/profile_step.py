"""Where a decode step's time goes: the engine's step split into the scheduler, the host-side
preparation of the batch, the linear layers, a mixture of experts' expert MLPs, attention, RMSNorm
with the residual adds, the rest of the forward (RoPE, SiLU·mul, embedding), the LM head, sampling
(with penalties and biases) and the rest of the step (output bookkeeping, detokenization), for fp32
and INT8 weights at batch 1 and a larger batch, batch 1 against its memory-bandwidth bound
(benchmarks/bandwidth.py). Each precision runs twice: as the engine runs it (a decode-only step's
layers in one C call, `one_call_forward`, engine/models/decode.py) and "per-op" (the same kernels
called one by one from Python, each part timed).

    python -m benchmarks.profile_step            # SmolLM2, 2 threads, batch 1 and 32, 32 steps each
    python -m benchmarks.profile_step --torch-ops    # also fp32 with cpu_kernels=False (torch ops only)
    python -m benchmarks.profile_step --smoke    # a tiny random model, in seconds
    python -m benchmarks.profile_step --model FOLDER   # another model, e.g. a mixture of experts

Each run records the last step's experts run (summed over MoE layers) and bytes of weights read
(EngineStats); a mixture of experts' batch-1 bound is those bytes.

The configurations take turns (a few steps each, round after round), so a noisy machine slows
them alike and their ratios hold.

Each part is timed by wrapping its function (exclusive time: a part called inside another is
subtracted from it), so the parts add up to the step. Writes profile_step.json and
profile_step.png under --out (benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import torch

from benchmarks.bandwidth import read_bandwidth
from benchmarks.common import add_common_args, done, machine, out_dir, tiny_model
from benchmarks.decode_latency import weight_bytes
from benchmarks.workloads import chat_prompts
from engine import LLM, SamplingParams

PARTS = (
    "scheduler",
    "prepare",
    "linears",
    "experts",
    "attention",
    "rms_norm",
    "forward_rest",
    "one_call_forward",
    "lm_head",
    "sampling",
    "step_rest",
)


class _TimedDecode:
    """The model's one-call decode forward (engine/models/decode.py), timed as one part."""

    def __init__(self, decode, timer: Timer):
        self.decode, self.applies = decode, decode.applies
        self.call = timer.wrap("one_call_forward", decode.__call__)

    def __call__(self, *args):
        return self.call(*args)


class Timer:
    """Exclusive seconds per part, over nested wrapped calls (`clock`: wall time, or e.g. the thread's
    CPU time)."""

    def __init__(self, clock=time.perf_counter) -> None:
        self.clock = clock
        self.seconds: dict[str, float] = defaultdict(float)
        self._stack: list[list] = []

    def wrap(self, part: str, fn):
        def timed(*args, **kwargs):
            inside_head = part == "linears" and self._stack and self._stack[-1][0] == "lm_head"
            frame = ["lm_head" if inside_head else part, 0.0]  # [part, seconds of wrapped children]
            self._stack.append(frame)
            t = self.clock()
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = self.clock() - t
                self._stack.pop()
                self.seconds[frame[0]] += elapsed - frame[1]
                if self._stack:
                    self._stack[-1][1] += elapsed

        return timed


@contextmanager
def instrumented(llm: LLM, timer: Timer):
    """Wrap the engine's parts (this engine object's, and the module functions its forward calls)."""
    import engine.model_runner as runner_mod
    from engine.models.fused import CPUOps, TorchOps
    from engine.models.linear import Linear
    from engine.models.moe import MoEBlock
    from engine.models.quant import Int8Linear

    engine = llm.engine
    runner, model = engine.runner, engine.runner.model
    patches = [
        (runner_mod, "sample_ids"),
        (runner_mod, "process_logits"),
        (TorchOps, "add_rms_norm"),
        (CPUOps, "add_rms_norm"),
        (Linear, "__call__"),
        (Int8Linear, "__call__"),
        (MoEBlock, "__call__"),
    ]
    saved = [(obj, name, getattr(obj, name)) for obj, name in patches]
    parts = {"sample_ids": "sampling", "process_logits": "sampling", "add_rms_norm": "rms_norm"}
    for obj, name, fn in saved:
        part = "experts" if obj is MoEBlock else parts.get(name, "linears")
        setattr(obj, name, timer.wrap(part, fn))
    instance = [
        (engine, "step", "step_rest"),
        (engine.scheduler, "schedule", "scheduler"),
        (runner, "_prepare", "prepare"),
        (model, "forward", "forward_rest"),
        (model.attention, "forward", "attention"),
        (model, "logits", "lm_head"),
    ]
    for obj, name, part in instance:
        setattr(obj, name, timer.wrap(part, getattr(obj, name)))
    decode = model.decode
    if decode is not None:
        model.decode = _TimedDecode(decode, timer)
    try:
        yield
    finally:
        model.decode = decode
        for obj, name, _ in instance:
            delattr(obj, name)  # back to the class's method
        for obj, name, fn in saved:
            setattr(obj, name, fn)


def profile(llm: LLM, prompts: list[list[int]], steps: int) -> dict:
    """Decode steps of len(prompts) sequences (their prefills done first, not counted)."""
    engine = llm.engine
    params = SamplingParams(max_tokens=steps + 2, temperature=0, ignore_eos=True)
    for i, ids in enumerate(prompts):
        engine.add_request(f"p{i}", ids, params)
    while (
        any(s.num_computed_tokens < s.num_prompt_tokens for s in engine.scheduler.running)
        or engine.scheduler.num_waiting
    ):
        engine.step()
    engine.step()  # a warm decode step
    timer = Timer()
    with instrumented(llm, timer):
        t = time.perf_counter()
        for _ in range(steps):
            engine.step()
        total = time.perf_counter() - t
    for i in range(len(prompts)):
        engine.abort(f"p{i}")
    ms = {part: 1000 * timer.seconds[part] / steps for part in PARTS}
    stats = engine.stats  # the last step's reads (mixtures of experts: the experts it ran)
    return {
        "batch": len(prompts),
        "steps": steps,
        "step_ms": 1000 * total / steps,
        "parts_ms": ms,
        "experts_touched": stats.last_step_experts_touched,
        "weight_bytes": stats.last_step_weight_bytes,
    }


def merge(total: dict, run: dict) -> None:
    """Adds one round's profile into the running mean of its configuration."""
    if not total:
        total.update(run, parts_ms=dict(run["parts_ms"]), rounds=1)
        return
    n = total["rounds"]
    total["step_ms"] = (total["step_ms"] * n + run["step_ms"]) / (n + 1)
    for part, ms in run["parts_ms"].items():
        total["parts_ms"][part] = (total["parts_ms"][part] * n + ms) / (n + 1)
    total["steps"] += run["steps"]
    total["rounds"] = n + 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--torch-ops", action="store_true", help="also profile fp32 with cpu_kernels=False")
    ap.add_argument("--model", default="smollm2", help="a model spec (a folder, e.g. a mixture of experts)")
    add_common_args(ap)
    args = ap.parse_args()
    out = out_dir(args, "profile_step")
    model = tiny_model() if args.smoke else args.model
    steps = 4 if args.smoke else args.steps
    torch.set_num_threads(args.threads)
    configs = {"fp32": dict(quantization=None), "fp32 per-op": dict(quantization=None)}
    if args.torch_ops:
        configs["fp32 torch ops"] = dict(quantization=None, cpu_kernels=False)
    configs["int8"] = dict(quantization="int8")
    configs["int8 per-op"] = dict(quantization="int8")
    llms = {
        name: LLM(model=model, dtype="float32", num_threads=args.threads, **kw)
        for name, kw in configs.items()
    }
    for name, llm in llms.items():
        if name.endswith("per-op"):  # the same kernels called one by one from Python
            llm.engine.runner.model.decode = None
    prompts = chat_prompts(next(iter(llms.values())).tokenizer, args.batch, max_len=128)
    rounds = 1 if args.smoke else 4
    runs = {}
    for batch in (1, args.batch):
        print(f"batch {batch} ...", flush=True)
        for _ in range(rounds):
            for name, llm in llms.items():
                merge(
                    runs.setdefault(f"{name} batch {batch}", {}),
                    profile(llm, prompts[:batch], steps // rounds),
                )
    bandwidth = read_bandwidth(args.threads, gib=0.25 if args.smoke else 1.0)
    for name, run in runs.items():  # batch 1 reads every weight once a step (MoE: the experts it ran)
        if run["batch"] == 1:
            llm = llms[name.rsplit(" batch", 1)[0]]
            moe = llm.engine.runner.model.spec.moe is not None
            run["bound_ms"] = 1000 * (run["weight_bytes"] if moe else weight_bytes(llm)) / bandwidth
            run["fraction_of_bound"] = run["bound_ms"] / run["step_ms"]
    report = {
        "model": "tiny-random" if args.smoke else _model_name(args.model),
        "smoke": args.smoke,
        "threads": args.threads,
        "read_bandwidth_gb_s": bandwidth / 1e9,
        "machine": machine(),
        "torch": torch.__version__,
        "runs": runs,
    }
    (out / "profile_step.json").write_text(json.dumps(report, indent=2))
    print("\n| part (ms per step) | " + " | ".join(runs) + " |")
    print("|---|" + "---:|" * len(runs))
    for part in PARTS:
        print(f"| {part} | " + " | ".join(f"{r['parts_ms'][part]:.2f}" for r in runs.values()) + " |")
    print("| **step** | " + " | ".join(f"{r['step_ms']:.2f}" for r in runs.values()) + " |")
    print("| bound (weights / read bandwidth) | " + " | ".join(_bound(r) for r in runs.values()) + " |")
    print(
        "| experts run (MoE layers summed) | "
        + " | ".join(str(r["experts_touched"]) for r in runs.values())
        + " |"
    )
    print(f"read bandwidth: {bandwidth / 1e9:.1f} GB/s (benchmarks/bandwidth.py)")
    plot(runs, out / "profile_step.png", f"{report['model']}, {args.threads} threads")
    done(out)


def _model_name(model: str) -> str:
    return "SmolLM2-135M-Instruct" if model == "smollm2" else Path(model).name


def _bound(run: dict) -> str:
    if "bound_ms" not in run:
        return ""
    return f"{run['bound_ms']:.2f} ({run['fraction_of_bound']:.2f})"


def plot(runs: dict, path: Path, what: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    names, bottom = list(runs), [0.0] * len(runs)
    for part in PARTS:
        vals = [runs[n]["parts_ms"][part] for n in names]
        ax.bar(names, vals, bottom=bottom, label=part)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set(ylabel="ms per decode step", title=f"where a decode step's time goes: {what}")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
