"""`fairlane serve`'s thread policy for workers that share the host with the gateway: a core left
to the gateway, the rest split among the workers, passive OpenMP waits, and the operator's own
settings untouched. The spawned worker process has the variables in its environment from its
first instruction (OpenMP reads OMP_WAIT_POLICY once, when torch loads it)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from gateway.cli.serve import _worker_spawner
from gateway.cli.threads import engine_threads, usable_cpus, worker_env
from gateway.settings import ServeSettings

STRONG = "fl-admin-" + "x" * 24


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    for name in list(os.environ):
        if (
            name.startswith("FAIRLANE_")
            and not name.startswith("FAIRLANE_TEST_")
            or name == "OMP_WAIT_POLICY"
        ):
            monkeypatch.delenv(name)
    monkeypatch.setenv("FAIRLANE_CONFIG", "")


@pytest.mark.parametrize(
    "workers,cpus,threads", [(1, 1, 1), (1, 2, 1), (1, 4, 3), (1, 16, 15), (2, 16, 7), (3, 2, 1), (0, 8, 7)]
)
def test_a_core_is_left_to_the_gateway_and_the_rest_split(workers, cpus, threads):
    assert engine_threads(workers, cpus) == threads


def test_the_operators_settings_win():
    assert worker_env({}, None, 1, cpus=2) == {
        "OMP_WAIT_POLICY": "PASSIVE",
        "FAIRLANE_ENGINE__NUM_THREADS": "1",
    }
    assert worker_env({"OMP_WAIT_POLICY": "ACTIVE"}, None, 1, cpus=8) == {"FAIRLANE_ENGINE__NUM_THREADS": "7"}
    assert worker_env({"FAIRLANE_ENGINE__NUM_THREADS": "2"}, None, 1, cpus=8) == {
        "OMP_WAIT_POLICY": "PASSIVE"
    }
    assert worker_env({}, 4, 1, cpus=8) == {"OMP_WAIT_POLICY": "PASSIVE"}  # engine.num_threads from YAML


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(entry.decode().split("=", 1) for entry in raw if b"=" in entry)


def _spawned_env(settings: ServeSettings) -> dict[str, str]:
    process = _worker_spawner(settings, "redis://127.0.0.1:6379/0")()
    try:
        return _environ(process.pid)  # Popen returns after the exec: this is the worker's own
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")
def test_the_spawned_worker_gets_the_policy(monkeypatch):
    env = _spawned_env(ServeSettings(admin_token=STRONG, engine={"model": "dummy"}))
    assert env["OMP_WAIT_POLICY"] == "PASSIVE"
    assert env["FAIRLANE_ENGINE__NUM_THREADS"] == str(max(1, usable_cpus() - 1))
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    env = _spawned_env(ServeSettings(admin_token=STRONG, engine={"model": "dummy", "num_threads": 2}))
    assert env["OMP_WAIT_POLICY"] == "ACTIVE" and "FAIRLANE_ENGINE__NUM_THREADS" not in env
