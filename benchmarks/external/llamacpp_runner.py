"""Batch-1 decode time of llama.cpp, from llama-cpp-python's own environment (never a dependency
of fairlane); benchmarks.decode_latency starts it as `PYTHON benchmarks/external/llamacpp_runner.py JOB.json`.
JOB.json: {"gguf", "prompt": [token ids], "tokens", "threads"}. Prints one line, "RESULT " and JSON
{"ms_per_token", "tokens"}: the time after the first token over the tokens after the first.
Only the standard library and llama_cpp are imported here.
"""

from __future__ import annotations

import json
import sys
import time

RESULT = "RESULT"  # the result line's prefix, told apart from what the library prints to stdout


def main() -> None:
    job = json.loads(open(sys.argv[1]).read())
    from llama_cpp import Llama

    llm = Llama(model_path=job["gguf"], n_ctx=2048, n_threads=job["threads"], n_batch=512, verbose=False)
    prompt, n = job["prompt"], job["tokens"]

    def run(count: int) -> float:
        llm.reset()
        t = time.perf_counter()
        produced = 0
        for _ in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
            produced += 1
            if produced >= count:
                break
        return time.perf_counter() - t

    run(4)  # warm-up
    first, total = run(1), run(n)
    print(RESULT, json.dumps({"ms_per_token": 1000 * (total - first) / (n - 1), "tokens": n}))


if __name__ == "__main__":
    main()
