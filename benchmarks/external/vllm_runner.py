"""Runs a benchmark workload on vLLM, from vLLM's own Python environment (vLLM is never a
dependency of fairlane). benchmarks.throughput and benchmarks.decode_latency start it as

    VLLM_PYTHON benchmarks/external/vllm_runner.py JOB.json

JOB.json: {"model": HF folder, "dtype", "threads", "mode": "throughput" | "latency" | "steps",
"prompts": [[token ids], ...], "max_tokens": [n, ...], "ignore_eos": bool}. It prints one "RESULT "
line of JSON: throughput {"seconds", "output_tokens"}; latency {"ms_per_token", "tokens"} (one request,
the time after its first token over the tokens after the first).

"steps" serves measurements while its caller measures other systems in turn (benchmarks/moe.py):
it prints RESULT {"ready": true} once loaded, then answers each stdin line {"batch": B, "steps": N}
with RESULT {"ms_per_step": ...}: the first B prompts run to N + 1 tokens, and the engine core's
own clock from a request's first token to its last, over N, is one decode step of the batch
(vLLM's per-request stats: neither the prefill nor the caller's side of `generate` counts). Only
the standard library and vLLM are imported here.
"""

from __future__ import annotations

import json
import os
import sys
import time

RESULT = "RESULT"  # the result line's prefix: vLLM logs to stdout too, even at shutdown


def main() -> None:
    job = json.loads(open(sys.argv[1]).read())
    threads = int(job.get("threads", 2))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{threads - 1}")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    # steps: per-request stats on (their engine-core token timestamps time the decode steps)
    extra = {"disable_log_stats": False} if job["mode"] == "steps" else {}
    llm = LLM(
        model=job["model"], dtype=job["dtype"], max_model_len=job.get("max_model_len", 2048), seed=0, **extra
    )
    prompts = [TokensPrompt(prompt_token_ids=p) for p in job["prompts"]]

    def params(n: int) -> SamplingParams:
        return SamplingParams(max_tokens=n, temperature=0, ignore_eos=job["ignore_eos"])

    llm.generate(prompts[:1], params(4), use_tqdm=False)  # warm-up: compiled graphs, caches
    if job["mode"] == "steps":
        serve_steps(llm, prompts, params)
        return
    if job["mode"] == "latency":
        # Time to 1 token, then to n tokens: the difference over n - 1 is the per-token decode time.
        n = job["max_tokens"][0]
        t = time.perf_counter()
        llm.generate(prompts[:1], params(1), use_tqdm=False)
        first = time.perf_counter() - t
        t = time.perf_counter()
        out = llm.generate(prompts[:1], params(n), use_tqdm=False)
        total = time.perf_counter() - t
        tokens = len(out[0].outputs[0].token_ids)
        print(
            RESULT,
            json.dumps({"ms_per_token": 1000 * (total - first) / max(1, tokens - 1), "tokens": tokens}),
        )
        return
    t = time.perf_counter()
    out = llm.generate(prompts, [params(n) for n in job["max_tokens"]], use_tqdm=False)
    seconds = time.perf_counter() - t
    print(
        RESULT,
        json.dumps({"seconds": seconds, "output_tokens": sum(len(o.outputs[0].token_ids) for o in out)}),
    )


def serve_steps(llm, prompts, params) -> None:
    """Per stdin line {"batch", "steps"}: the ms of one decode step of that batch (module docstring)."""
    print(RESULT, json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            break
        ask = json.loads(line)
        batch, n = prompts[: ask["batch"]], ask["steps"]
        out = llm.generate(batch, params(n + 1), use_tqdm=False)
        stats = [o.metrics for o in out]
        assert all(s is not None and s.num_generation_tokens == n + 1 for s in stats), stats
        ms = [1000 * (s.last_token_ts - s.first_token_ts) / n for s in stats]
        print(RESULT, json.dumps({"ms_per_step": sum(ms) / len(ms)}), flush=True)


if __name__ == "__main__":
    main()
