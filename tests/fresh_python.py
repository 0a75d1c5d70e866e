"""Run a snippet in a fresh interpreter on the checkout alone (no inherited PYTHONPATH or PATH): what
a module loads on its own cannot be seen in the test process, which has loaded everything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_fresh(code: str, *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    """The finished snippet (its output in ``stdout``, ``stderr``); fails the test if it failed."""
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": ""},
        timeout=timeout_s,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done
