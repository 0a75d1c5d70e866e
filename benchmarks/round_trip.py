"""Round trips as a client sees them: `fairlane serve` as a subprocess on a real port, chat requests
over HTTP in a closed loop, and the same requests run in process on an engine.

Used by benchmarks.gateway_overhead; each function returns latencies in seconds.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Served:
    process: subprocess.Popen
    base_url: str
    api_key: str
    log_path: Path

    def stop(self) -> None:
        """SIGTERM to fairlane (it stops its worker and its Redis), then anything left in its group."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()


def serve(
    model: str, workdir: Path, *, env: dict[str, str], timeout_s: float = 180.0, repo: Path = REPO
) -> Served:
    """`fairlane serve --dev` for `model` (embedded Redis-compatible server, SQLite in workdir, one
    worker); returns once a worker serves the model, with the demo tenant's key. ``repo``: the
    source tree it runs from (another checkout, to compare two versions in one run)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    full_env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")])),
        "FAIRLANE_DATABASE_URL": f"sqlite:///{workdir / 'serve.db'}",
        "FAIRLANE_ENGINE__MODEL": model,
        **env,
    }
    full_env.pop("FAIRLANE_REDIS_URL", None)
    log_path = workdir / "serve.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "serve", "--dev", "--port", str(port)],
            env=full_env,
            cwd=repo,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    served = Served(process, f"http://127.0.0.1:{port}", "", log_path)
    deadline = time.monotonic() + timeout_s
    # One client for every poll: each new one builds an SSL context (tens of ms of CPU, taken from
    # the server that is starting on the same cores).
    with httpx.Client(timeout=2) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                log_text = log_path.read_text()
                raise RuntimeError(f"fairlane serve exited with {process.returncode}:\n{log_text}")
            try:
                if client.get(served.base_url + "/ready").status_code == 200:
                    match = re.search(r"demo API key:\s+(\S+)", log_path.read_text())
                    if match:
                        served.api_key = match.group(1)
                        return served
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
    served.stop()
    raise TimeoutError(f"fairlane serve not ready in {timeout_s} s:\n{log_path.read_text()}")


def start_at_once(starts: dict[str, Callable[[], Served]], into: dict[str, Served]) -> None:
    """Run the ``starts`` (``serve`` calls) at the same time, each server put in ``into`` as it comes
    up (the caller stops them, a start failed or not); a failed start's error is raised once every
    start has ended."""
    with ThreadPoolExecutor(len(starts)) as pool:
        futures = {name: pool.submit(start) for name, start in starts.items()}
        for name, future in futures.items():
            if future.exception() is None:
                into[name] = future.result()
        for future in futures.values():
            future.result()


async def lean_closed_loop(
    served: Served, body: dict, *, requests: int, concurrency: int, times_ns: list | None = None
) -> list[float]:
    """`requests` POSTs of `body` to /v1/chat/completions from `concurrency` callers, each on its
    keep-alive connection (as an OpenAI client holds them); each one's seconds from send to parsed
    JSON, or, with ``"stream": true``, to the stream's last chunk (after ``data: [DONE]``). The
    client costs the machine almost nothing: the request's bytes written once per call, the
    response's headers and body read back (a JSON body parsed). httpx spends about 1.5 ms of CPU per
    request (3 ms at 32 callers) on the cores the gateway uses, which a client on another host
    would not. The client's own garbage collector is off while it sends (what the process
    allocated before is frozen): a collection of the benchmark's heap took 20 ms, counted in
    the round trip it fell in, which no server did. ``times_ns``: each request's (send, end)
    ``time.perf_counter_ns()`` is appended to it."""
    host, port = served.base_url.removeprefix("http://").rsplit(":", 1)
    payload = json.dumps(body).encode()
    message = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}:{port}\r\n"
        f"content-type: application/json\r\nauthorization: Bearer {served.api_key}\r\n"
        f"content-length: {len(payload)}\r\n\r\n"
    ).encode() + payload
    latencies: list[float] = []
    left = requests

    async def caller() -> None:
        nonlocal left
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            while left > 0:
                left -= 1
                start = time.perf_counter()
                writer.write(message)
                head = await reader.readuntil(b"\r\n\r\n")
                fields = {
                    k.strip().lower(): v.strip()
                    for k, v in (line.split(b":", 1) for line in head.split(b"\r\n")[1:] if b":" in line)
                }
                if fields.get(b"transfer-encoding") == b"chunked":  # a stream: to its last chunk
                    data = await _chunked(reader)
                    if not data.rstrip().endswith(b"data: [DONE]"):
                        raise RuntimeError(f"a stream without [DONE]: {data[-300:]!r}")
                else:
                    data = await reader.readexactly(int(fields[b"content-length"]))
                    json.loads(data)
                latencies.append(time.perf_counter() - start)
                if times_ns is not None:
                    times_ns.append((round(start * 1e9), time.perf_counter_ns()))
                status = int(head.split(b" ", 2)[1])
                if status != 200:
                    raise RuntimeError(f"HTTP {status}: {data[:300]!r}")
        finally:
            writer.close()

    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        await asyncio.gather(*(caller() for _ in range(concurrency)))
    finally:
        gc.enable()
        gc.unfreeze()
    return latencies


async def _chunked(reader: asyncio.StreamReader) -> bytes:
    """A chunked body, read to its terminating chunk."""
    data = bytearray()
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
        chunk = await reader.readexactly(size + 2)  # the chunk and its CRLF
        if not size:
            return bytes(data)
        data += chunk[:-2]


def engine_closed_loop(
    llm, messages: list[dict], params, *, requests: int, concurrency: int, idle_s: float = 0.0
) -> list[float]:
    """The same requests in process: tokenize (the chat template), add to the engine, step until
    finished (text detokenized as a server does), `concurrency` in flight; seconds per request.
    ``idle_s``: the process sleeps this long before each request is sent (not counted in its
    latency), as a served engine idles while a request travels to it and back. The process's
    garbage collector runs as a worker's does (gateway/telemetry/gc_policy.py)."""
    from gateway.telemetry import gc_policy

    thresholds = gc_policy.freeze()
    try:
        return _engine_loop(llm, messages, params, requests=requests, concurrency=concurrency, idle_s=idle_s)
    finally:
        gc_policy.thaw(thresholds)


def _engine_loop(
    llm, messages: list[dict], params, *, requests: int, concurrency: int, idle_s: float
) -> list[float]:
    engine, latencies, started, sent = llm.engine, [], {}, 0

    def submit() -> None:
        nonlocal sent
        if idle_s:
            time.sleep(idle_s)
        request_id, sent = f"r{sent}", sent + 1
        started[request_id] = time.perf_counter()
        engine.add_request(request_id, llm.encode(messages), params)

    for _ in range(min(concurrency, requests)):
        submit()
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                latencies.append(time.perf_counter() - started.pop(out.request_id))
                if sent < requests:
                    submit()
    return latencies
