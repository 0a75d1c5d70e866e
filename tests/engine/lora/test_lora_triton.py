"""The Triton SGMV kernels (GPU path) against the torch kernel and the engine with them against
PEFT (tests/engine/lora/triton_sgmv_check.py), in a subprocess: on the CPU in Triton's interpreter
(TRITON_INTERPRET=1 set before triton is imported, affecting nothing else), on a GPU compiled."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

HERE = Path(__file__).parent
ROOT = HERE.parents[2]


def _check(interpret: bool, *args: str) -> str:
    """Run the check script; its stdout, after asserting that it passed."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    cmd = [sys.executable, str(HERE / "triton_sgmv_check.py"), str(HERE), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU runs the kernels compiled (test below)")
def test_triton_sgmv_matches_torch_and_peft_in_interpreter():
    out = _check(True)
    assert "kernels torch.bfloat16" in out and "engine with triton LoRA matches PEFT" in out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (compiled kernels)")
def test_triton_sgmv_matches_torch_and_peft_compiled_on_the_gpu():
    out = _check(False, "--device", "cuda")
    assert "engine with triton LoRA matches PEFT" in out and "device cuda" in out
    assert "graph decodes with LoRA match the eager engine and PEFT" in out
