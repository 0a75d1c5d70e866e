"""Soak: many requests from many tenants through `fairlane serve` while things go wrong, then a
count of what was lost or leaked.

    python -m benchmarks.soak                  # 10,000 requests (tens of minutes on 2 cores)
    python -m benchmarks.soak --smoke          # 100 requests, the same faults and checks

`fairlane serve --dev` runs as a subprocess (embedded Redis-compatible server, SQLite, one worker)
on a tiny random-weight Llama with peaked logits (greedy answers do not depend on the batch) and
a KV cache too small for the requests in flight, so sequences are preempted (counted from
serve's /metrics). ``--tenants`` tenants
send ``--requests`` greedy completions (streamed or not) at ``--concurrency``; a quarter of the
tenants have a tight quota (requests per minute, one request in flight), so some requests are
refused with 429 (callers wait as ``retry-after`` says after a 429 or 503); about one stream in
ten is dropped by its client after a few chunks. A third of the way in the engine worker is
SIGKILLed (serve restarts it; its requests are claimed and resume),
two thirds of the way in the embedded Redis is SIGKILLed (serve restarts it; streams cut by it end
with an error event).

At the end (counted by benchmarks/soak_checks.py):
- every KV block of the live worker is free (its heartbeat in Redis);
- every quota lease is released (``in_flight`` 0 in each tenant's live quota usage);
- one usage record per admitted request (each answered 200, or cut after admission), none for
  refused ones, none twice; finished requests recorded with all their tokens;
- lost or duplicated tokens: every completion that finished is compared, token by token, with an
  undisturbed run of the same prompt made before the load; the count of tokens missing or extra.

Writes soak.json and soak.png under --out (benchmarks/results); exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

import httpx

from benchmarks.common import PEAKED_DUMMY_CONFIG, add_common_args, done, machine, out_dir
from benchmarks.round_trip import serve
from benchmarks.soak_checks import check, outcome, passed, tokens

LOG_TAIL = 3000  # characters of the server's log shown when the run fails
KV_BLOCKS = 20  # of 16 tokens: about 3 of the longest requests at once, far fewer than run concurrently
PROMPTS = [
    (f"soak prompt {i}: " + "tell me more " * (i % 4), 8 + 6 * i) for i in range(8)
]  # (text, max_tokens)
MODEL = "dummy"


class Soak:
    def __init__(self, served, admin: str, args) -> None:
        self.served, self.args = served, args
        self.admin = {"Authorization": f"Bearer {admin}"}
        self.tenants: list[dict] = []  # id, key, tight
        self.reference: dict[int, list[int]] = {}
        self.results: list[dict] = []
        self.faults: list[dict] = []
        self.started = time.monotonic()

    async def setup(self, http: httpx.AsyncClient) -> None:
        for i in range(self.args.tenants):
            tight = i % 4 == 3
            tenant = (
                await http.post("/admin/tenants", json={"name": f"soak-{i}"}, headers=self.admin)
            ).json()
            key = (
                await http.post(f"/admin/tenants/{tenant['id']}/keys", json={"name": "k"}, headers=self.admin)
            ).json()["key"]
            if tight:
                quota = {"requests_per_minute": 20, "max_concurrency": 1}
                response = await http.put(
                    f"/admin/tenants/{tenant['id']}/quota", json=quota, headers=self.admin
                )
                assert response.status_code == 200, response.text
            self.tenants.append({"id": tenant["id"], "key": key, "tight": tight})
        key = next(t["key"] for t in self.tenants if not t["tight"])
        for index, (prompt, max_tokens) in enumerate(PROMPTS):  # undisturbed, one at a time
            response = await http.post(
                "/v1/completions",
                headers={"Authorization": f"Bearer {key}"},
                json={
                    "model": MODEL,
                    "prompt": prompt,
                    "max_tokens": max_tokens,
                    "temperature": 0,
                    "ignore_eos": True,
                },
            )
            assert response.status_code == 200, response.text
            self.reference[index] = tokens(response.json()["choices"][0]["text"])
            assert len(self.reference[index]) == max_tokens

    async def one(self, http: httpx.AsyncClient, rng: random.Random) -> None:
        tenant = rng.choice(self.tenants)
        index = rng.randrange(len(PROMPTS))
        prompt, max_tokens = PROMPTS[index]
        stream = rng.random() < 0.5
        drop_after = rng.randint(1, 4) if stream and rng.random() < 0.1 else None
        body = {
            "model": MODEL,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": stream,
            "user": f"tenant-{tenant['id']}",
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        out = {
            "prompt": index,
            "tenant": tenant["id"],
            "stream": stream,
            "dropped": False,
            "status": None,
            "request_id": None,
            "text": "",
            "finish": None,
            "error": None,
            "usage": None,
        }
        headers = {"Authorization": f"Bearer {tenant['key']}"}
        try:
            if not stream:
                response = await http.post("/v1/completions", json=body, headers=headers)
                out["status"], out["request_id"] = response.status_code, response.headers.get("x-request-id")
                out["retry_after"] = response.headers.get("retry-after")
                data = response.json()
                if response.status_code == 200:
                    out["text"], out["finish"] = (
                        data["choices"][0]["text"],
                        data["choices"][0]["finish_reason"],
                    )
                    out["usage"] = data["usage"]["completion_tokens"]
                else:
                    out["error"] = data["error"]["code"] or data["error"]["type"]
            else:
                async with http.stream("POST", "/v1/completions", json=body, headers=headers) as response:
                    out["status"], out["request_id"] = (
                        response.status_code,
                        response.headers.get("x-request-id"),
                    )
                    out["retry_after"] = response.headers.get("retry-after")
                    if response.status_code != 200:
                        data = json.loads(await response.aread())
                        out["error"] = data["error"]["code"] or data["error"]["type"]
                    else:
                        await self._read_stream(response, out, drop_after)
        except httpx.HTTPError as exc:
            out["error"] = f"transport: {type(exc).__name__}"
        out["at"] = time.monotonic() - self.started
        self.results.append(out)
        if out["status"] in (429, 503):  # as a well-behaved client: wait as told (at most a few seconds)
            await asyncio.sleep(min(float(out.get("retry_after") or 1.0), 3.0))

    @staticmethod
    async def _read_stream(response: httpx.Response, out: dict, drop_after: int | None) -> None:
        chunks = 0
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            if "error" in chunk:
                out["error"] = chunk["error"]["code"] or chunk["error"]["type"]
                continue
            if chunk.get("usage"):
                out["usage"] = chunk["usage"]["completion_tokens"]
            for choice in chunk["choices"]:
                out["text"] += choice["text"] or ""
                out["finish"] = choice["finish_reason"] or out["finish"]
            chunks += 1
            if drop_after is not None and chunks >= drop_after and out["finish"] is None:
                out["dropped"] = True  # the client goes away: leaving the block closes the connection
                return

    def processes(self) -> dict:
        return httpx.get(self.served.base_url + "/ready", timeout=10).json()["processes"]

    def kill(self, name: str) -> None:
        process = self.processes()[name]
        os.kill(process["pid"], signal.SIGKILL)
        self.faults.append({"at": time.monotonic() - self.started, "killed": name, "pid": process["pid"]})

    async def run(self) -> None:
        rng = random.Random(self.args.seed)
        limits = httpx.Limits(max_connections=self.args.concurrency + 8)
        async with httpx.AsyncClient(base_url=self.served.base_url, timeout=180, limits=limits) as http:
            await self.setup(http)
            self.started = time.monotonic()
            left = self.args.requests
            kill_at = {self.args.requests * 2 // 3: "worker-0", self.args.requests // 3: "redis"}

            async def caller() -> None:
                nonlocal left
                while left > 0:
                    left -= 1
                    name = kill_at.pop(left, None)
                    if name is not None:
                        await asyncio.to_thread(self.kill, name)
                    await self.one(http, rng)

            await asyncio.gather(*(caller() for _ in range(self.args.concurrency)))
            self.elapsed = time.monotonic() - self.started


def plot(result: dict, results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.5))
    kinds = sorted({outcome(r) for r in results})
    for row, kind in enumerate(kinds):
        xs = [r["at"] for r in results if outcome(r) == kind]
        ax.plot(xs, [row] * len(xs), "|", markersize=12, label=f"{kind} ({len(xs)})")
    for fault in result["faults"]:
        ax.axvline(fault["at"], color="red", linestyle="--", linewidth=1)
        ax.text(
            fault["at"], len(kinds) - 0.35, f" {fault['killed']} killed", color="red", fontsize=8, va="center"
        )
    ax.set_ylim(-0.6, len(kinds) - 0.1)
    ax.set_yticks(range(len(kinds)), kinds)
    ax.set_xlabel("seconds into the load (when each request ended)")
    verdict = "nothing lost, nothing leaked" if result["passed"] else "CHECKS FAILED"
    ax.set_title(f"soak: {len(results)} requests, {result['tenants']} tenants: {verdict}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(parser)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--tenants", type=int, default=24)
    parser.add_argument("--concurrency", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.smoke:
        args.requests, args.tenants, args.concurrency = 100, 8, 12
    out = out_dir(args, "soak")
    with tempfile.TemporaryDirectory(prefix="fairlane-soak-") as workdir:
        env = {
            "FAIRLANE_ENGINE__DUMMY_CONFIG": json.dumps(PEAKED_DUMMY_CONFIG),
            "FAIRLANE_ENGINE__NUM_KV_BLOCKS": str(KV_BLOCKS),
            "FAIRLANE_ENGINE__NUM_THREADS": "1",
            "FAIRLANE_MAX_TOKENS_DEFAULT": "16",
            "FAIRLANE_ENGINE__DTYPE": "float32",
        }
        served = serve(MODEL, Path(workdir), env=env)
        try:
            banner = served.log_path.read_text()
            served.redis_url = re.search(r"redis:\s+(\S+)", banner).group(1)
            admin = re.search(r"admin token:\s+(\S+)", banner).group(1)
            soak = Soak(served, admin, args)
            try:
                asyncio.run(soak.run())
            except Exception:  # the error, then what the server said last (a test shows the end)
                traceback.print_exc(limit=-3)
                print(f"--- the last of {served.log_path}:", file=sys.stderr)
                print(served.log_path.read_text()[-LOG_TAIL:], file=sys.stderr)
                raise SystemExit(1) from None
            checks = check(soak, Path(workdir) / "serve.db", MODEL)
            processes = soak.processes()
        finally:
            served.stop()
    result = {
        "benchmark": "soak",
        "smoke": args.smoke,
        "machine": machine(),
        "requests": args.requests,
        "tenants": args.tenants,
        "concurrency": args.concurrency,
        "kv_blocks": KV_BLOCKS,
        "elapsed_s": soak.elapsed,
        "faults": soak.faults,
        "processes_after": processes,
        "outcomes": dict(Counter(outcome(r) for r in soak.results)),
        "checks": checks,
        "passed": passed(checks),
    }
    (out / "soak.json").write_text(json.dumps(result, indent=1))
    plot(result, soak.results, out / "soak.png")
    print(
        json.dumps({k: result[k] for k in ("elapsed_s", "faults", "outcomes", "checks", "passed")}, indent=1)
    )
    done(out)
    if not result["passed"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
