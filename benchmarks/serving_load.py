"""A small closed-loop load generator for OpenAI-compatible servers: `concurrency` streams of chat
completions over HTTP (SSE), each recording its time to first token and the gaps between tokens.

Used by benchmarks.serving when aiperf is not given (and by its --smoke run).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time

import httpx

WORDS = "the quick brown fox jumps over a lazy dog while seven wise owls watch from old oak trees".split()


def prompt_text(tokens: int, salt: int) -> str:
    """About `tokens` prompt tokens of plain words (one token each in the usual BPE vocabularies); the
    salt makes every request's prompt differ, so no server can reuse another's prefix."""
    words = [WORDS[(salt * 7 + i) % len(WORDS)] for i in range(max(tokens - 12, 1))]
    return f"{salt} " + " ".join(words)


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) of `values`."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[min(max(round(q), 1), 99) - 1]


async def one_stream(client: httpx.AsyncClient, body: dict) -> dict:
    """One streamed chat: seconds to the first content token and between tokens, tokens received."""
    start = time.perf_counter()
    stamps: list[float] = []
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {(await response.aread())[:500]!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            for choice in chunk.get("choices", []):
                if choice.get("delta", {}).get("content"):
                    stamps.append(time.perf_counter())
    if not stamps:
        raise RuntimeError("a stream ended without a token")
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    return {"ttft": stamps[0] - start, "gaps": gaps, "tokens": len(stamps)}


async def drive(
    url: str,
    key: str,
    model: str,
    *,
    concurrency: int,
    requests: int,
    input_tokens: int,
    output_tokens: int,
) -> tuple[list[dict], float]:
    """`requests` streamed chats from `concurrency` callers; (per-request records, wall seconds)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    records: list[dict] = []
    sent = 0
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=600) as client:

        async def caller() -> None:
            nonlocal sent
            while sent < requests:
                sent += 1
                body = {
                    "model": model,
                    "messages": [{"role": "user", "content": prompt_text(input_tokens, sent)}],
                    "max_tokens": output_tokens,
                    "min_tokens": output_tokens,
                    "ignore_eos": True,
                    "stream": True,
                }
                records.append(await one_stream(client, body))

        start = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return records, wall
