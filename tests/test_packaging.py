"""The built package as a user installs it: the wheel holds the C kernel's source and the default
configuration, `pip install` keeps a torch build the user already has, and the installed package
compiles and runs the C kernel from where it is installed.

Nothing is downloaded: the venvs see this machine's packages (--system-site-packages) and pip runs
with --no-index. A fake `torch` 2.5.0+cu121 distribution stands for a user's CUDA build.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "engine", "gateway", "tenancy", "quotas", "migrations", "configs")
USER_TORCH = "2.5.0+cu121"


def _run(*args, cwd: Path, env: dict | None = None) -> str:
    done = subprocess.run(
        [str(a) for a in args], check=False, cwd=cwd, env=env or _clean_env(), capture_output=True, text=True
    )
    assert done.returncode == 0, f"{args}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def _clean_env(**extra) -> dict:
    """No PYTHONPATH: the venv must import what pip installed, not the repository."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("PIP_")}
    return {**env, "PIP_DISABLE_PIP_VERSION_CHECK": "1", **extra}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """`pip wheel` of a copy of the working tree (the build writes nothing into the repository)."""
    src, dist = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("dist")
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "*.db")
    for name in SOURCES:
        path = REPO / name
        (shutil.copytree(path, src / name, ignore=ignore) if path.is_dir() else shutil.copy(path, src / name))
    _run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        dist,
        ".",
        cwd=src,
    )
    (built,) = dist.glob("fairlane-*.whl")
    return built


def _venv(path: Path) -> Path:
    """A venv over this machine's packages, with no pip of its own (the system's runs in it)."""
    _run(sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", path, cwd=path.parent)
    return path / "bin" / "python"


def _fake_torch_wheel(folder: Path) -> Path:
    """A minimal wheel named torch, version 2.5.0+cu121: stands for a CUDA build already installed."""
    info = f"torch-{USER_TORCH}.dist-info"
    files = {
        "torch/__init__.py": f'__version__ = "{USER_TORCH}"\n',
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {USER_TORCH}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: fairlane-tests\nRoot-Is-Purelib: true\nTag: "
        "py3-none-any\n",
    }
    record = [f"{name},sha256={_digest(text)},{len(text.encode())}" for name, text in files.items()]
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    path = folder / f"torch-{USER_TORCH}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return path


def _digest(text: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()


def test_wheel_holds_the_kernel_source_and_the_configs(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        metadata = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "engine/attention/csrc/paged_decode.c" in names
    assert {"configs/fairlane.yaml", "configs/examples/prompts.jsonl"} <= names
    assert "quotas/lua/admit.lua" in names and "migrations/script.py.mako" in names
    assert "Requires-Dist: torch>=2.4" in metadata.splitlines()


def test_install_keeps_the_users_torch_build(wheel, tmp_path):
    python = _venv(tmp_path / "venv")
    _run(
        python,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-index",
        "--no-deps",
        _fake_torch_wheel(tmp_path),
        cwd=tmp_path,
    )
    # With dependency resolution, offline: every other requirement is met by the machine's packages.
    _run(
        python, "-m", "pip", "install", "-q", "--no-index", "--find-links", wheel.parent, wheel, cwd=tmp_path
    )
    code = (
        "import importlib.metadata as m, torch; print(m.version('torch'), torch.__version__, torch.__file__)"
    )
    version, runtime, where = _run(python, "-c", code, cwd=tmp_path).split()
    assert version == runtime == USER_TORCH and where.startswith(str(tmp_path / "venv"))


KERNEL_CHECK = """
import json, os
from engine import Engine, SamplingParams
from engine.attention import cpu_paged
from engine.models import decode as one_call
import gateway.settings

tiny = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=256, initializer_range=0.5)
tokens, kernel_calls = {}, []
decode = cpu_paged.CPUPagedAttention._decode
cpu_paged.CPUPagedAttention._decode = lambda self, *a: kernel_calls.append(1) or decode(self, *a)
one_call_steps, step = [], one_call.DecodeForward.__call__
one_call.DecodeForward.__call__ = lambda self, *a: one_call_steps.append(1) or step(self, *a)
for backend in ("cpu", "torch"):
    engine = Engine(model="dummy", dtype="float32", num_threads=1, dummy_config=tiny, num_kv_blocks=16,
                    attention_backend=backend)
    engine.add_request("r", list(range(3, 40)), SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    tokens[backend] = [t for _ in iter(engine.has_unfinished, False) for out in engine.step()
                       for t in out.new_token_ids]
print(json.dumps({"source": str(cpu_paged.SOURCE), "library": cpu_paged.load_library()._name,
                  "kernel_calls": len(kernel_calls), "one_call_steps": len(one_call_steps),
                  "one_call_library": one_call._library(False)._name,
                  "config": str(gateway.settings.config_file()), "tokens": tokens}))
"""


def test_installed_package_compiles_and_runs_the_kernel(wheel, tmp_path):
    python = _venv(tmp_path / "venv")
    _run(
        python, "-m", "pip", "install", "-q", "--no-index", "--find-links", wheel.parent, wheel, cwd=tmp_path
    )
    env = _clean_env(
        FAIRLANE_CACHE_DIR=str(tmp_path / "cache")
    )  # an empty cache: the kernel is compiled here
    env.pop("FAIRLANE_CONFIG", None)
    report = json.loads(_run(python, "-c", KERNEL_CHECK, cwd=tmp_path, env=env).strip().splitlines()[-1])
    site = str(tmp_path / "venv" / "lib")
    assert report["source"].startswith(site) and report["source"].endswith("csrc/paged_decode.c")
    assert report["library"].startswith(str(tmp_path / "cache" / "kernels"))
    assert report["config"].startswith(site) and report["config"].endswith("configs/fairlane.yaml")
    assert report["one_call_library"].startswith(str(tmp_path / "cache" / "kernels"))
    # every decode step of the cpu engine runs its layers in one C call (decode_forward.c, which
    # includes the attention kernel's source); nothing calls the attention kernel from Python
    assert report["one_call_steps"] >= 11 and report["kernel_calls"] == 0
    assert len(report["tokens"]["cpu"]) == 12 and report["tokens"]["cpu"] == report["tokens"]["torch"]
