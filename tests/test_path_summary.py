"""The suite's CI output names the engine's numeric paths it ran (tests/engine/paths.py), under
pytest-xdist as CI runs it: the workers' reports carry each test's path to the controller."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SWAP_TESTS = "tests/engine/test_swap.py"  # 9 tests, 3 on each of two paths


def test_the_engine_paths_run_are_listed_under_xdist():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "XDIST"))}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "1", SWAP_TESTS],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    summary = done.stdout.split("engine paths run", 1)[-1]
    assert "engine paths run" in done.stdout
    assert "fp32-c: 3 passed" in summary and "fp32-torch: 3 passed" in summary
