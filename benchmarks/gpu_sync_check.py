"""Host synchronisations inside a sampled engine step, on a GPU: the forward of mixed steps
(prefill chunks and decodes, greedy and seeded top-k/top-p rows) runs under
`torch.cuda.set_sync_debug_mode("error")`, so any hidden wait raises with its stack; whole steps
run under "warn" and may synchronise once (reading the sampled token ids back).

    python3 -m benchmarks.gpu_sync_check            # the first CUDA GPU (benchmarks/gpu_checklist.sh)
    python3 -m benchmarks.gpu_sync_check --device cpu   # the same steps, no sync check (a dry run)
"""

from __future__ import annotations

import argparse
import json
import warnings

import torch

from benchmarks.gpu import SHAPES
from engine import LLM, SamplingParams


def check(device: str = "cuda", steps: int = 6) -> dict:
    on_cuda = device.startswith("cuda")
    llm = LLM(
        model="dummy",
        dummy_config=SHAPES["135m" if on_cuda else "tiny"],
        device=device,
        dtype="bfloat16" if on_cuda else "float32",
        kv_cache_gib=0.5 if on_cuda else 0.05,
        max_num_batched_tokens=256,
        max_model_len=1024,
    )
    eng, runner = llm.engine, llm.engine.runner
    for i in range(8):
        params = (
            SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
            if i % 2
            else SamplingParams(max_tokens=64, temperature=0.8, top_k=20, top_p=0.9, seed=i, ignore_eos=True)
        )
        eng.add_request(f"s{i}", [2 + (7 * i + t) % 300 for t in range(40 + 60 * i)], params)
    eng.step()  # the first step compiles nothing more than the warm-up did, but allocates
    forwards = syncs = 0
    forward = runner.forward

    def strict_forward(plan):  # the step's forward, prepare and copies included, under "error"
        nonlocal forwards
        forwards += 1
        if on_cuda:
            torch.cuda.set_sync_debug_mode("error")
        try:
            return forward(plan)
        finally:
            if on_cuda:
                torch.cuda.set_sync_debug_mode(0)

    runner.forward = strict_forward
    for _ in range(steps):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if on_cuda:
                torch.cuda.set_sync_debug_mode("warn")
            try:
                eng.step()  # raises where the forward waits; warns where the rest of the step does
            finally:
                if on_cuda:
                    torch.cuda.set_sync_debug_mode(0)
        syncs = max(syncs, sum("synchroniz" in str(w.message) for w in caught))
    runner.forward = forward
    result = {"device": device, "checked_forwards": forwards, "max_syncs_per_step": syncs}
    assert syncs <= 1, result
    return result


def run(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args(argv)
    result = check(args.device, args.steps)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    run()
