"""The engine's plain-Python half loads without torch: the scheduler and its policies, the simulator,
the configs, requests and errors, and the public names a gateway imports from `engine`."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLAIN = ["engine.config", "engine.request", "engine.errors", "engine.block_manager"] + sorted(
    ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
    for folder in ("engine/scheduler", "engine/sim")
    for p in (ROOT / folder).glob("*.py")
)
PUBLIC = [
    "SamplingParams",
    "RequestOutput",
    "FinishReason",
    "EngineConfig",
    "SchedulerConfig",
    "SLOLoad",
    "predict_ttft",
    "POLICY_PARTS",
    "parse_policy",
    "EngineError",
    "SLOUnattainableError",
]

CHECK = """
import importlib, sys
for name in sys.argv[2:]:
    importlib.import_module(name)
engine = importlib.import_module("engine")
for name in sys.argv[1].split(","):
    getattr(engine, name)
heavy = sorted(m for m in ("torch", "transformers", "triton") if m in sys.modules)
print(",".join(heavy) or "none")
"""


def test_the_plain_python_half_of_the_engine_loads_no_torch():
    assert "engine.scheduler.registry" in PLAIN and "engine.sim.scenarios" in PLAIN
    done = subprocess.run(
        [sys.executable, "-c", CHECK, ",".join(PUBLIC), *PLAIN],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": ""},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "none", f"loaded {done.stdout.split()[-1]}"


def test_the_check_sees_torch_when_it_is_loaded():
    done = subprocess.run(
        [sys.executable, "-c", CHECK, "Engine"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": ""},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "torch" in done.stdout.split()[-1].split(",")
