"""The LoRA kernels compiled for an H100 (sm_90a) without a GPU, by Triton's compiler and its
bundled ptxas (tests/engine/kernels/offline_sm90.py --lora, in a process without the interpreter),
as the engine launches them (fp32 adapters) at an 8B's fused qkv and down projections: a bf16 or
fp16 model's dots are tensor-core MMAs on bf16 or fp16 operands, a fp32 model's take none (IEEE
fp32, exact); none spills a register and each fits the 227 KB of shared memory a block may use."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

REPO = Path(__file__).resolve().parents[3]
H100_SHARED = 227 * 1024
OPERANDS = {"bfloat16": ".bf16.bf16.f32", "float16": ".f16.f16.f32"}  # A, B types, fp32 accumulator


@pytest.fixture(scope="module")
def report() -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    script = REPO / "tests" / "engine" / "kernels" / "offline_sm90.py"
    cmd = [sys.executable, str(script), "--lora"]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_both_kernels_compile_in_every_model_dtype(report):
    built = {(r["kernel"], r["variant"].split()[0]) for r in report}
    assert built == {(k, d) for k in ("_shrink", "_expand") for d in ("bfloat16", "float16", "float32")}


def test_bf16_and_fp16_dots_are_mmas_on_16_bit_operands(report):
    for r in report:
        dtype = r["variant"].split()[0]
        if dtype == "float32":  # IEEE fp32 dots: FMAs, no tensor-core instruction at all
            assert r["mma"] == [], r
        else:  # every MMA of the kernel on the model's dtype, accumulating in fp32
            assert r["mma"] and all(k.endswith(OPERANDS[dtype]) for k in r["mma"]), r


def test_no_spills_and_shared_memory_fits_an_h100(report):
    assert all(r["spill_bytes"] == 0 for r in report), report
    assert all(0 < r["shared"] <= H100_SHARED for r in report), report
