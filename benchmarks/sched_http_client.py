"""The clients of `benchmarks.scheduling --http`: each trace tenant's requests streamed by the
official `openai` client from a process of its own.

One event loop holding every stream of a run (hundreds of a batch tenant's beside a few of an
interactive one) is itself a queue: a chunk of the interactive tenant waits while the loop parses
the batch tenant's chunks, and on a 2-core machine shared with the server that loop stalled for
100 ms and more, which the run then counted as the server's latency. Tenants are different users
on different machines, so each gets its own process (and loop) here; they share only the wall
clock (``t0``). This module imports nothing of the engine, so a client process starts in a
fraction of a second.
"""

from __future__ import annotations

import asyncio
import atexit
import random
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context

import openai

from benchmarks.sched_prompts import prompt

TIERS = {1: "priority", 0: "standard"}  # a trace's priority -> the service_tier its requests name
LAG_EVERY_S = 0.005  # how often a client process checks how late its event loop is
START_AHEAD_S = 0.5  # the first arrival this long after the clients are told t0 (they warm up)


@dataclass
class Sent:
    """What the client saw of one request (wall-clock seconds, time.time())."""

    arrival_wall: float
    request_id: str = ""
    chunk_times: list[float] = field(default_factory=list)
    client_lag: float = 0.0  # how late its client's event loop woke at most before its first token
    tokens: int = 0
    error: str = ""  # the HTTP status (or "stream") and the error's code


@dataclass(frozen=True)
class Call:
    """One request to send: when (seconds after t0), its prompt length, output length, priority."""

    arrival: float
    prompt_len: int
    output_len: int
    priority: int
    seed: int  # its prompt's tokens


async def _one(
    client: openai.AsyncOpenAI, model: str, call: Call, t0: float, sent: Sent, words: list[int]
) -> None:
    rng = random.Random(call.seed)
    await asyncio.sleep(max(0.0, t0 + call.arrival - time.time()))
    ids = prompt(rng, words, call.prompt_len)
    try:
        stream = await client.completions.create(
            model=model,
            prompt=ids,
            max_tokens=call.output_len,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True, "service_tier": TIERS[call.priority]},
        )
        async for chunk in stream:
            sent.request_id = sent.request_id or chunk.id.partition("-")[2]
            if chunk.choices:
                sent.chunk_times.append(time.time())
            if chunk.usage is not None:
                sent.tokens = chunk.usage.completion_tokens
    except openai.APIError as e:  # a refusal (429/503) or an error event in the stream ("stream")
        sent.error = f"{getattr(e, 'status_code', 'stream')} {e.code or type(e).__name__}"


async def replay_calls(
    base_url: str, model: str, key: str, calls: list[Call], until: float | None, t0: float, words: list[int]
) -> list[Sent]:
    """Send ``calls`` with one key from this process's loop, their prompts drawn from ``words``
    (benchmarks.sched_prompts); streams still open ``until`` seconds after t0 are closed (the
    server aborts them)."""
    client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key=key, max_retries=0, timeout=600)
    if t0 > time.time():  # a fresh process: its first request's one-off costs (the client's lazy
        # imports and parsers, the connection) go before the run, not on its first arrival
        await client.models.list()
        _ = client.completions
    sent = [Sent(t0 + c.arrival) for c in calls]
    tasks = [asyncio.create_task(_one(client, model, c, t0, s, words)) for c, s in zip(calls, sent)]
    lags: list[tuple[float, float]] = []  # (when, how late) of this loop's wakes later than 1 ms
    monitor = asyncio.create_task(_watch_loop(lags))
    if tasks:
        timeout = None if until is None else until + max(0.0, t0 - time.time())
        _done, pending = await asyncio.wait(tasks, timeout=timeout)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    monitor.cancel()
    await client.close()
    for s in sent:
        end = s.chunk_times[0] if s.chunk_times else s.arrival_wall
        s.client_lag = max((lag for t, lag in lags if s.arrival_wall <= t <= end + lag), default=0.0)
    return sent


async def _watch_loop(lags: list[tuple[float, float]], every_s: float = LAG_EVERY_S) -> None:
    """Note when this process's event loop wakes a sleeper more than 1 ms late (the client's own
    stalls: a request's first token waits for them too, and they are not the server's)."""
    while True:
        asked = time.perf_counter()
        await asyncio.sleep(every_s)
        late = time.perf_counter() - asked - every_s
        if late > 0.001:
            lags.append((time.time(), late))


def _client_process(
    base_url: str, model: str, key: str, calls: list[Call], until, t0: float, words: list[int]
) -> list[Sent]:
    return asyncio.run(replay_calls(base_url, model, key, calls, until, t0, words))


def _started(delay_s: float) -> int:
    time.sleep(delay_s)  # busy until every process of the pool holds one of these
    return 0


_pool: tuple[ProcessPoolExecutor, int] | None = None  # the client processes and their number, kept


def _clients(n: int) -> ProcessPoolExecutor:
    """A pool of at least ``n`` client processes, every one started and its imports done. Kept for
    the next run: a spawned process imports the benchmark's main module again (the engine, torch),
    seconds of CPU a run on the cores the server uses."""
    global _pool
    if _pool is None or _pool[1] < n:
        close_clients()
        _pool = ProcessPoolExecutor(max_workers=n, mp_context=get_context("spawn")), n
        list(_pool[0].map(_started, [0.2] * n))  # every process up (each holds one of these at once)
    return _pool[0]


def close_clients() -> None:
    """Stop the client processes (at the end of the benchmark)."""
    global _pool
    if _pool is not None:
        _pool[0].shutdown()
        _pool = None


atexit.register(close_clients)


def replay_in_processes(
    base_url: str,
    model: str,
    calls: dict[str, tuple[str, list[Call]]],
    until: float | None,
    words: list[int],
    start_ahead_s: float = START_AHEAD_S,
) -> tuple[dict[str, list[Sent]], float]:
    """Each tenant's ``calls`` (tenant -> (key, calls)) from a client process of its own (an idle
    process of the pool takes one call at a time), on one wall clock; what each saw, and the run's
    t0 (time.time(), ``start_ahead_s`` from now)."""
    if not calls:  # a trace with no request in its duration
        return {}, time.time()
    pool = _clients(len(calls))
    t0 = time.time() + start_ahead_s
    futures = {
        tenant: pool.submit(_client_process, base_url, model, key, tenant_calls, until, t0, words)
        for tenant, (key, tenant_calls) in calls.items()
    }
    return {tenant: future.result() for tenant, future in futures.items()}, t0
