"""`fairlane serve --gateway-workers 2`: two gateway processes on one port, each answering alone
while the other is stopped (SIGSTOP: its connections wait in the shared socket's backlog until the
other accepts them), and both gone when serve stops. Neither loads torch (gateway/cli/torch_free.py),
though the model's config and tokenizer are read through transformers."""

from __future__ import annotations

import os
import signal
import time

import httpx
from serve_process import free_port, start

from benchmarks.common import tiny_model

STOPPED_FOR_S = 20.0  # a request must be answered by the process left running within this


def _answered(base_url: str, key: str) -> bool:
    r = httpx.get(base_url + "/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=STOPPED_FOR_S)
    return r.status_code == 200 and r.json()["object"] == "list"


def _wait_for(served, name: str, timeout_s: float = 120.0) -> int:
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=2) as client:  # one SSL context for every poll
        while time.monotonic() < deadline:
            assert served.process.poll() is None, served.log()
            try:
                body = client.get(served.base_url + "/ready").json()
                child = body.get("processes", {}).get(name)
                if child and child["state"] == "running" and child["pid"]:
                    return child["pid"]
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.3)
    raise TimeoutError(served.log())


def test_two_gateway_processes_share_the_port_and_each_answers(tmp_path):
    import re

    port = free_port()
    env = {"FAIRLANE_ENGINE__MODEL": tiny_model(), "FAIRLANE_DATABASE_URL": f"sqlite:///{tmp_path / 'f.db'}"}
    served = start(
        ["serve", "--dev", "--port", str(port), "--workers", "0", "--gateway-workers", "2"],
        env,
        str(tmp_path / "serve.log"),
        port=port,
    )
    try:
        other = _wait_for(served, "gateway-1")
        key = re.search(r"demo API key:\s+(\S+)", served.log()).group(1)
        for pid in (other, served.process.pid):
            with open(f"/proc/{pid}/maps") as maps:
                assert "libtorch" not in maps.read(), f"gateway process {pid} loaded torch"
        for stopped in (other, served.process.pid):  # each process answers with the other stopped
            os.kill(stopped, signal.SIGSTOP)
            try:
                assert all(_answered(served.base_url, key) for _ in range(5))
            finally:
                os.kill(stopped, signal.SIGCONT)
        served.process.terminate()
        assert served.process.wait(timeout=60) == 0
        assert "gateway-1 exited" not in served.log()  # it served from its start to serve's stop
        time.sleep(0.5)
        assert (
            not os.path.exists(f"/proc/{other}")
            or "Z" in open(f"/proc/{other}/stat").read().split(")")[1][:3]
        )
    finally:
        served.stop()
