"""Does one client's huge prompt delay another's request? `/health` latency while clients send
1 MB prompts to `fairlane serve`.

    python -m benchmarks.health_under_load            # about 1 minute
    python -m benchmarks.health_under_load --smoke    # seconds (both servers start at once)

`fairlane serve --dev` runs as a subprocess on a real port (embedded Redis-compatible server,
SQLite, one worker) with a tiny random-weight Llama and SmolLM2's real tokenizer. A load process
runs ``--clients`` callers, each sending chat requests whose one user message is ``--prompt-chars``
characters, back to back; meanwhile this process asks ``GET /health`` every ``--probe-every-ms``
and records each answer's latency. Three phases, each ``--seconds`` long:

- ``idle``: no load (the baseline);
- ``refused``: the server's default limits, under which a 1 MB prompt is refused before it is
  tokenized (413: the body is over ``max_body_bytes``; 400 past ``max_prompt_chars``);
- ``tokenized``: the limits raised (``FAIRLANE_MAX_BODY_BYTES``, ``FAIRLANE_MAX_PROMPT_CHARS``) so
  every prompt is rendered by the chat template and tokenized (off the event loop, in a thread)
  before the context check refuses it (400): the worst case for the gateway's loop.

The target: p99 of ``/health`` <= 50 ms in every phase. Writes health_under_load.json and
health_under_load.png under --out (benchmarks/results).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import tempfile
import time
from collections import Counter
from functools import partial
from pathlib import Path

import httpx

from benchmarks.common import add_common_args, done, machine, out_dir, tiny_model
from benchmarks.round_trip import serve, start_at_once

TARGET_P99_MS = 50.0


def pct(values: list[float], q: float) -> float:
    """The q-quantile of `values` (in their unit)."""
    return (
        statistics.quantiles(values, n=1000, method="inclusive")[round(q * 1000) - 1]
        if len(values) > 1
        else values[0]
    )


def _load(
    base_url: str, api_key: str, model: str, clients: int, prompt_chars: int, seconds: float, statuses
) -> None:
    """The load process: `clients` callers sending one pre-encoded huge chat body back to back."""
    filler = "The quick brown fox jumps over the lazy dog. "
    text = (filler * (prompt_chars // len(filler) + 1))[:prompt_chars]
    body = json.dumps(
        {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 1}
    ).encode()
    headers = {"Authorization": f"Bearer {api_key}", "content-type": "application/json"}

    async def run() -> None:
        deadline = time.monotonic() + seconds
        async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=120) as client:

            async def caller() -> None:
                while time.monotonic() < deadline:
                    response = await client.post("/v1/chat/completions", content=body)
                    statuses.append(response.status_code)

            await asyncio.gather(*(caller() for _ in range(clients)))

    asyncio.run(run())


def probe(base_url: str, *, seconds: float, every_s: float) -> list[tuple[float, float]]:
    """(seconds since start, latency in ms) of GET /health every `every_s` for `seconds`."""
    samples = []
    with httpx.Client(base_url=base_url, timeout=30) as client:
        client.get("/health")  # the connection is open before the first sample
        start = time.perf_counter()
        while (now := time.perf_counter()) - start < seconds:
            response = client.get("/health")
            latency = time.perf_counter() - now
            assert response.status_code == 200, response.text
            samples.append((now - start, 1000 * latency))
            time.sleep(max(0.0, every_s - latency))
    return samples


def phase(served, model: str, args, *, load: bool) -> dict:
    statuses = multiprocessing.Manager().list() if load else []
    loader = None
    if load:
        loader = multiprocessing.Process(
            target=_load,
            args=(
                served.base_url,
                served.api_key,
                model,
                args.clients,
                args.prompt_chars,
                args.seconds,
                statuses,
            ),
        )
        loader.start()
        time.sleep(0.5)  # the first huge bodies are on their way
    samples = probe(served.base_url, seconds=args.seconds, every_s=args.probe_every_ms / 1000)
    if loader is not None:
        loader.join(timeout=300)
    latencies = sorted(ms for _, ms in samples)
    return {
        "probes": len(latencies),
        "p50_ms": pct(latencies, 0.50),
        "p99_ms": pct(latencies, 0.99),
        "max_ms": latencies[-1],
        "load_requests": len(statuses),
        "load_statuses": dict(Counter(statuses)),
        "samples": samples,
    }


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    for name, run in result["phases"].items():
        xs, ys = zip(*run["samples"], strict=True) if run["samples"] else ((), ())
        ax.plot(xs, ys, ".", markersize=3, label=f"{name}: p99 {run['p99_ms']:.1f} ms")
    ax.axhline(
        TARGET_P99_MS, color="red", linestyle="--", linewidth=1, label=f"target p99 {TARGET_P99_MS:.0f} ms"
    )
    ax.set_yscale("log")
    ax.set_xlabel("seconds into the phase")
    ax.set_ylabel("GET /health latency (ms)")
    ax.set_title(
        f"/health while {result['clients']} clients send {result['prompt_chars']:,}-character prompts"
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(parser)
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--prompt-chars", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--probe-every-ms", type=float, default=10.0)
    args = parser.parse_args(argv)
    if args.smoke:
        args.clients, args.prompt_chars, args.seconds = 2, 200_000, 1.0
    out = out_dir(args, "health_under_load")
    model = tiny_model()
    raised = {
        "FAIRLANE_MAX_BODY_BYTES": str(4 * args.prompt_chars + 4096),
        "FAIRLANE_MAX_PROMPT_CHARS": str(args.prompt_chars + 1),
    }
    phases: dict = {}
    with tempfile.TemporaryDirectory(prefix="fairlane-health-") as workdir:

        def start(name: str, env: dict[str, str]):
            folder = Path(workdir) / name
            folder.mkdir()
            return serve(model, folder, env=env)

        servers = {"refused": {}, "tokenized": raised}
        started: dict = {}  # --smoke: both servers start at once (the second idles meanwhile)
        try:
            if args.smoke:
                start_at_once({name: partial(start, name, env) for name, env in servers.items()}, started)
            for name, env in servers.items():
                served = started.pop(name, None) or start(name, env)
                try:
                    if name == "refused":
                        phases["idle"] = phase(served, Path(model).name, args, load=False)
                    phases[name] = phase(served, Path(model).name, args, load=True)
                finally:
                    served.stop()
        finally:
            for served in started.values():
                served.stop()
    result = {
        "benchmark": "health_under_load",
        "smoke": args.smoke,
        "machine": machine(),
        "clients": args.clients,
        "prompt_chars": args.prompt_chars,
        "seconds_per_phase": args.seconds,
        "probe_every_ms": args.probe_every_ms,
        "target_p99_ms": TARGET_P99_MS,
        "met": all(p["p99_ms"] <= TARGET_P99_MS for p in phases.values()),
        "phases": phases,
    }
    (out / "health_under_load.json").write_text(json.dumps(result, indent=1))
    plot(result, out / "health_under_load.png")
    print(f"{'phase':<10} {'probes':>7} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}  load statuses")
    for name, run in phases.items():
        print(
            f"{name:<10} {run['probes']:>7} {run['p50_ms']:>8.1f} {run['p99_ms']:>8.1f} "
            f"{run['max_ms']:>8.1f}  "
            f"{run['load_statuses']}"
        )
    done(out)


if __name__ == "__main__":
    main()
