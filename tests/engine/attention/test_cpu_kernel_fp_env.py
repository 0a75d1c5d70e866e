"""Loading the C decode kernel (compiled with -ffast-math) leaves the process's floating point
alone: no flush-to-zero of subnormals for Python, torch or anything else in the process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
CHECK = """
import torch
from engine.attention.cpu_paged import load_library
tiny = 2.2250738585072014e-308  # the smallest normal double
load_library()
print(tiny / 2 > 0, bool(torch.tensor(1e-40, dtype=torch.float32) > 0))
"""


def test_loading_the_kernel_keeps_subnormals(tmp_path):
    env = {**os.environ, "FAIRLANE_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(REPO)}  # compiled afresh
    out = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, env=env, cwd=REPO, check=True
    )
    assert out.stdout.split() == ["True", "True"], out.stderr
    assert list((tmp_path / "kernels").glob("paged_decode-*.so"))
