"""Start `fairlane serve` (or a lone gateway / worker) as a user would: a subprocess, real ports."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

import httpx

from benchmarks.common import PEAKED_DUMMY_CONFIG

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fairlane_command() -> list[str]:
    """The installed console script if there is one, else the same entry point through python -m."""
    script = shutil.which("fairlane")
    return [script] if script else [sys.executable, "-m", "gateway.cli"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def refused_serve(env: dict[str, str], *args: str, timeout_s: float = 120.0) -> str:
    """`fairlane serve --dev` on a free port, ``env`` over this process's (the checkout on
    PYTHONPATH), run to its end: what it printed, once it is seen to have stopped with status 1."""
    result = subprocess.run(
        [*fairlane_command(), "serve", "--dev", "--port", str(free_port()), *args],
        env={**os.environ, "PYTHONPATH": REPO, **env},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    return output


@dataclass
class Served:
    process: subprocess.Popen
    port: int
    log_path: str
    admin_token: str | None = None
    api_key: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self) -> None:
        """SIGTERM to fairlane itself (it stops its workers, then its Redis), then the group."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # anything left in its process group
        except ProcessLookupError:
            pass
        self.process.wait()


def start(args: list[str], env: dict[str, str], log_path: str, *, port: int | None = None) -> Served:
    """Run ``fairlane <args>`` in its own process group, output to log_path."""
    full_env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), **env}
    log = open(log_path, "w")
    process = subprocess.Popen(
        [*fairlane_command(), *args],
        env=full_env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=REPO,
        start_new_session=True,
    )
    return Served(process=process, port=port or 0, log_path=log_path)


def wait_ready(served: Served, timeout_s: float = 180.0) -> Served:
    """Wait for /ready (a worker serves the model) and read the --dev banner if there is one."""
    deadline = time.monotonic() + timeout_s
    # One client for every poll: each new one builds an SSL context (tens of ms of CPU, taken from
    # the server that is starting on the same cores).
    with httpx.Client(timeout=2) as client:
        while time.monotonic() < deadline:
            if served.process.poll() is not None:
                raise RuntimeError(f"fairlane exited with {served.process.returncode}:\n{served.log()}")
            try:
                if client.get(served.base_url + "/ready").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        else:
            raise TimeoutError(f"fairlane not ready in {timeout_s} s:\n{served.log()}")
    banner = served.log()
    if match := re.search(r"admin token:\s+(\S+)", banner):
        served.admin_token = match.group(1)
    if match := re.search(r"demo API key:\s+(\S+)", banner):
        served.api_key = match.group(1)
    if match := re.search(r"redis:\s+(\S+)", banner):
        served.extra["redis_url"] = match.group(1)
    return served


def request_usage_records(served: Served, request_id: str) -> list:
    """The usage records of one request in the database of a server started with its URL in
    ``served.extra["database_url"]``."""
    from sqlalchemy import select

    from tenancy import UsageRecord, make_engine, make_session_factory

    engine = make_engine(served.extra["database_url"])
    with make_session_factory(engine)() as session:
        rows = session.scalars(select(UsageRecord).where(UsageRecord.request_id == request_id)).all()
    engine.dispose()
    return list(rows)


def tiny_serve_env(tmp) -> dict[str, str]:
    """`fairlane serve` on a tiny random dummy model (float32, one thread), SQLite in ``tmp``."""
    return {
        "FAIRLANE_ENGINE__MODEL": "dummy",
        "FAIRLANE_ENGINE__DUMMY_CONFIG": json.dumps(PEAKED_DUMMY_CONFIG),
        "FAIRLANE_ENGINE__NUM_KV_BLOCKS": "512",
        "FAIRLANE_ENGINE__NUM_THREADS": "1",
        "FAIRLANE_ENGINE__DTYPE": "float32",
        "FAIRLANE_DATABASE_URL": f"sqlite:///{tmp / 'fairlane.db'}",
    }


def usage_by_request(tmp) -> dict:
    """The usage records of the SQLite database of ``tiny_serve_env(tmp)``, by request id."""
    from tenancy import UsageRecord, make_engine, make_session_factory

    engine = make_engine(f"sqlite:///{tmp / 'fairlane.db'}")
    with make_session_factory(engine)() as session:
        records = {r.request_id: r for r in session.query(UsageRecord).all()}
    engine.dispose()
    return records


def metric_by(served: Served, metric: str, label: str) -> dict[str, float]:
    """``metric``'s samples on serve's /metrics, summed by the value of ``label``."""
    import httpx

    sums: dict[str, float] = {}
    for line in httpx.get(served.base_url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(metric + "{") and f'{label}="' in line:
            value = line.split(f'{label}="', 1)[1].split('"', 1)[0]
            sums[value] = sums.get(value, 0.0) + float(line.rsplit(" ", 1)[1])
    return sums
