"""`fairlane serve` refusing to start, in one line that names why and with nothing left behind: a
port already taken, an address not on this host, a privileged port, a damaged checkpoint."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time

import pytest
from serve_process import REPO, fairlane_command, free_port, tiny_serve_env

from benchmarks.common import tiny_model


def _serve_once(
    tmp_path, *args: str, wrap: tuple[str, ...] = (), model: str | None = None
) -> tuple[subprocess.CompletedProcess, str]:
    env = {**os.environ, "PYTHONPATH": REPO, **tiny_serve_env(tmp_path)}
    if model is not None:
        env["FAIRLANE_ENGINE__MODEL"] = model
    result = subprocess.run(
        [*wrap, *fairlane_command(), "serve", "--dev", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return result, result.stdout + result.stderr


def test_a_taken_port_stops_serve_at_once_naming_it(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**os.environ, "PYTHONPATH": REPO, **tiny_serve_env(tmp_path)}
        began = time.monotonic()
        result = subprocess.run(
            [*fairlane_command(), "serve", "--dev", "--port", str(port)],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        took = time.monotonic() - began
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"127.0.0.1:{port}" in output and f"port {port}" in output
    assert "fl-" not in output and "admin token" not in output and "Traceback" not in output  # no key printed
    assert not (tmp_path / "fairlane.db").exists()  # nothing started
    assert took < 10, f"took {took:.1f} s"  # ~1 s on an idle machine: Python's start and the settings


def test_an_address_not_on_this_host_is_named_as_such(tmp_path):
    """Every bind error said "is port N taken by another server?", whatever the errno."""
    result, output = _serve_once(tmp_path, "--host", "192.0.2.1", "--port", str(free_port()))  # TEST-NET-1
    assert result.returncode == 1 and "192.0.2.1 is not an address of this host" in output
    assert "taken" not in output and "Traceback" not in output and len(output.strip().splitlines()) == 1
    result, output = _serve_once(tmp_path, "--host", "no-such-host.invalid", "--port", "8000")
    assert result.returncode == 1 and "'no-such-host.invalid' is not an address or a name" in output


def test_a_privileged_port_is_named_as_such(tmp_path):
    """EACCES: run without the capability to bind ports below 1024 (setpriv drops it, also for root)."""
    setpriv = shutil.which("setpriv")
    with open("/proc/sys/net/ipv4/ip_unprivileged_port_start") as f:
        if setpriv is None or int(f.read()) <= 81:
            pytest.skip("needs setpriv and a host where port 81 is privileged")
    drop = (setpriv, "--inh-caps=-net_bind_service", "--bounding-set=-net_bind_service")
    result, output = _serve_once(tmp_path, "--port", "81", wrap=drop)
    assert result.returncode == 1 and "permission denied: ports below" in output and "taken" not in output
    assert len(output.strip().splitlines()) == 1


def _damaged_copy(tmp_path) -> str:
    """The tiny model's folder with its weights file's header length overwritten (a damaged disk,
    a copy cut short)."""
    folder = tmp_path / "model"
    shutil.copytree(tiny_model(), folder)
    with open(folder / "model.safetensors", "r+b") as f:
        f.write(b"\xff" * 8)
    return str(folder)


def test_a_damaged_checkpoint_stops_serve_at_once_naming_it(tmp_path):
    """The model check's reader raised OverflowError: a 25-line traceback, no reason given."""
    model = _damaged_copy(tmp_path)
    result, output = _serve_once(tmp_path, "--port", str(free_port()), model=model)
    assert result.returncode == 1 and "Traceback" not in output
    assert f"cannot serve model {model!r}: its checkpoint cannot be read" in output
    assert len(output.strip().splitlines()) == 1
