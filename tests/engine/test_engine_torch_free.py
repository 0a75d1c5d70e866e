"""The engine's plain-Python half loads without torch: the scheduler and its policies, the simulator,
the configs, requests and errors, and the public names a gateway imports from `engine`."""

from tests.fresh_python import ROOT, run_fresh

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
    loaded = run_fresh(CHECK, ",".join(PUBLIC), *PLAIN).stdout.split()[-1]
    assert loaded == "none", f"loaded {loaded}"


def test_the_check_sees_torch_when_it_is_loaded():
    assert "torch" in run_fresh(CHECK, "Engine").stdout.split()[-1].split(",")
