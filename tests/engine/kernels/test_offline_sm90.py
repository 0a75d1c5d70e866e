"""Every Triton kernel compiled for an H100 (sm_90a) without a GPU, by Triton's compiler and its
bundled ptxas (tests/engine/kernels/offline_sm90.py, in a process without the interpreter): head
dims 64/128/256, bf16/fp16/fp32, GQA groups 1/4/8, one split and several, with attention sinks at
gpt-oss's head dim and group; the fused elementwise kernels at the 135M/1B/8B widths; LoRA
shrink/expand; the fused-MoE grouped GEMMs at the Qwen3-30B-A3B, gpt-oss-20b, Mixtral-8x7B and
OLMoE shapes, decode- and prefill-sized. Each fits the H100's 227 KB of shared memory
a block, and none spills registers in bf16 or fp16. Results are cached by Triton's cache key
(sm90_report.json), so only a changed kernel is compiled again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.kernels.variants import KERNEL_MODULES

REPO = Path(__file__).resolve().parents[3]
H100_SHARED = 227 * 1024  # bytes of shared memory one block may use


@pytest.fixture(scope="module")
def report() -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("offline_sm90.py"))],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=3000,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return lines[1:]


def test_every_kernel_is_compiled_at_every_served_shape(report):
    names = {n for names in KERNEL_MODULES.values() for n in names}
    assert {r["kernel"] for r in report} == names
    attention = {r["variant"] for r in report if r["kernel"] == "_prefill_kernel"}
    sinks = {v for v in attention if v.endswith(" sinks")}
    assert sinks == {f"{dt} head_dim 64 group 8 sinks" for dt in ("bfloat16", "float16", "float32")}
    assert {r["variant"] for r in report if r["kernel"] == "_reduce_kernel"} >= sinks
    assert attention - sinks == {
        f"{dt} head_dim {d} group {g}"
        for dt in ("bfloat16", "float16", "float32")
        for d in (64, 128, 256)
        for g in (1, 4, 8)
    }
    assert {r["variant"] for r in report if r["kernel"] == "_reduce_kernel"} >= {
        f"{dt} head_dim {d} group 1" for dt in ("bfloat16", "float32") for d in (64, 128, 256)
    }
    moe = {r["variant"] for r in report if r["kernel"] == "_moe_gate_up_kernel"}
    for dt in ("bfloat16", "float16", "float32"):  # both tile shapes, both activations
        assert {f"{dt} moe gpt-oss-20b tokens 1", f"{dt} moe mixtral-8x7b tokens 256"} <= moe


def test_shared_memory_fits_an_h100(report):
    over = [r for r in report if r["shared"] > H100_SHARED]
    assert not over, over


def test_no_register_spills_in_bf16_and_fp16(report):
    spills = [r for r in report if r["spill_bytes"] and not r["variant"].startswith("float32")]
    assert not spills, spills
