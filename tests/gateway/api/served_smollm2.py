"""The live `fairlane serve --dev` of the OpenAI sampling and logprobs tests (real SmolLM2, fp32)
and the direct fp32 forward (Hugging Face, in the test's process) they are held to."""

from __future__ import annotations

from collections import defaultdict

import torch
from serve_process import Served, free_port, start

MODEL = "smollm2"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
MAX_PROMPTS = 6  # the server's max_prompts_per_request


def start_fp32_server(tmp) -> Served:
    """`fairlane serve --dev` on SmolLM2 in float32, one engine thread, its own SQLite and Redis."""
    port = free_port()
    env = {
        "FAIRLANE_DATABASE_URL": f"sqlite:///{tmp / 'fairlane.db'}",
        "FAIRLANE_ENGINE__MODEL": MODEL,
        "FAIRLANE_ENGINE__DTYPE": "float32",
        "FAIRLANE_ENGINE__NUM_THREADS": "1",
        "FAIRLANE_ENGINE__MAX_NUM_SEQS": "8",
        "FAIRLANE_ENGINE__NUM_KV_BLOCKS": "128",
        "FAIRLANE_CONFIG": "",
        "FAIRLANE_REDIS_URL": "",
        "FAIRLANE_MAX_PROMPTS_PER_REQUEST": str(MAX_PROMPTS),
    }
    served = start(["serve", "--dev", "--port", str(port)], env, str(tmp / "serve.log"), port=port)
    served.extra["database_url"] = env["FAIRLANE_DATABASE_URL"]
    return served


def log_softmax(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)  # [len(ids), V]


def greedy(
    hf, ids: list[int], n: int, frequency_penalty: float = 0.0, presence_penalty: float = 0.0
) -> tuple[list[int], list[float]]:
    """HF greedy, a full forward per token; OpenAI's frequency and presence penalties applied by hand."""
    out, lps = [], []
    for _ in range(n):
        lp = log_softmax(hf, ids + out)[-1]
        logits = lp.clone()  # log_softmax differs from the logits by a constant: same argmax
        for t in set(out):
            logits[t] -= frequency_penalty * out.count(t) + presence_penalty
        token = int(logits.argmax())
        out.append(token)
        lps.append(float(lp[token]))
    return out, lps


def streamed(stream) -> tuple[dict[int, str], dict[int, list], object]:
    """A streamed completion's text and token logprobs per choice index, and its usage chunk's usage."""
    texts: dict[int, str] = defaultdict(str)
    logprobs: dict[int, list] = defaultdict(list)
    usage = None
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.text
            logprobs[c.index] += c.logprobs.token_logprobs if c.logprobs else []
        usage = chunk.usage or usage
    return texts, logprobs, usage
