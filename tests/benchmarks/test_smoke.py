"""Every benchmark runs: each module under benchmarks/ with a main() runs its --smoke setting as
`python -m benchmarks.NAME --smoke` (as the README gives it), writes its JSON and PNG to a temporary
folder, and leaves benchmarks/results/ as it was. A new benchmark is covered without a change here."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = sorted(
    p.stem
    for p in (REPO / "benchmarks").glob("*.py")
    if re.search(r"^def main\(", p.read_text(), re.M) and "__main__" in p.read_text()
)


def _results_state() -> dict[str, float]:
    return {p.name: p.stat().st_mtime for p in (REPO / "benchmarks" / "results").iterdir()}


def test_every_benchmark_is_found():
    assert {"gateway_overhead", "preemption", "sched_sim", "scheduling", "throughput"} <= set(BENCHMARKS)


# Options that take another path through a benchmark: smoke-run too.
VARIANTS = [("decode_latency", ("--family", "qwen3")), ("scheduling", ("--http",))]


# Under pytest-xdist each smoke run is a group of its own (tests/conftest.py), spread over the workers.
@pytest.mark.parametrize(
    "name,options",
    [
        pytest.param(name, options, marks=pytest.mark.xdist_group(f"benchmark-{name}{'-'.join(options)}"))
        for name, options in [*((name, ()) for name in BENCHMARKS), *VARIANTS]
    ],
)
def test_smoke(name, options):
    before = _results_state()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{name}", "--smoke", *options],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    match = re.search(r"^results: (.+)$", done.stdout, re.M)
    assert match, done.stdout[-2000:]
    out = Path(match.group(1))
    assert out.is_dir() and REPO / "benchmarks" / "results" not in (out, *out.parents)
    assert list(out.glob("*.json")) and list(out.glob("*.png"))
    shutil.rmtree(out)
    assert _results_state() == before
