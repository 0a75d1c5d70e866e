"""A gateway replica and the ``fairlane`` command load no torch: the engine's wire types, its TTFT
formula and its policy names come from torch-free modules (the engine loads torch only for Engine
and LLM, which only a worker and ``fairlane generate`` use)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REPLICA_MODULES = [
    "gateway.api.app",
    "gateway.cli",
    "gateway.cli.serve",
    "gateway.settings",
    "gateway.lanes.client",
    "gateway.api.slo_gate",
    "gateway.api.admit",
    "gateway.api.relay",
    "gateway.api.settle",
]


@pytest.mark.parametrize("module", REPLICA_MODULES)
def test_importing_loads_no_torch(module):
    code = (
        f"import sys, {module}\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers'))\n"
        "print(heavy[:5])"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        env={**os.environ, "PYTHONPATH": REPO},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", f"{module} loads {result.stdout.strip()}"


def test_the_check_can_fail():
    """The same probe sees torch where it is loaded (a worker's loop module needs the engine)."""
    code = "import sys, gateway.worker.loop; print('torch' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        env={**os.environ, "PYTHONPATH": REPO},
    )
    assert result.stdout.strip() == "True", result.stderr
