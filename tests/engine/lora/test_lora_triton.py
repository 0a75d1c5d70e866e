"""The Triton SGMV kernels (GPU path) in Triton's interpreter on CPU, in a subprocess so that
TRITON_INTERPRET=1 is set before triton is imported and affects nothing else."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

HERE = Path(__file__).parent
ROOT = HERE.parents[2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU runs the kernels compiled (test below)")
def test_triton_sgmv_matches_torch_and_peft_in_interpreter():
    env = {
        **os.environ,
        "TRITON_INTERPRET": "1",
        "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    proc = subprocess.run(
        [sys.executable, str(HERE / "triton_sgmv_check.py"), str(HERE)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "kernels torch.bfloat16" in proc.stdout and "engine with triton LoRA matches PEFT" in proc.stdout


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (compiled kernels)")
def test_triton_sgmv_matches_torch_and_peft_compiled_on_the_gpu():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    proc = subprocess.run(
        [sys.executable, str(HERE / "triton_sgmv_check.py"), str(HERE), "--device", "cuda"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "engine with triton LoRA matches PEFT" in proc.stdout and "device cuda" in proc.stdout
