"""The fused elementwise Triton kernels (engine/kernels/fused_ops.py) against the torch operators
they replace on CUDA (engine/models/fused.py's TorchOps): equal in fp32 and fp16; in bf16 within
two rounding steps (the interpreter's bf16 rounding is not round-to-nearest; docs/gpu.md)."""

from __future__ import annotations

import pytest
import torch

from engine.kernels.fused_ops import TritonOps
from engine.models.fused import TorchOps

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def same(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    if a.dtype == torch.bfloat16:
        torch.testing.assert_close(a.float(), b.float(), rtol=2**-6, atol=2**-5)
    elif a.dtype == torch.float32:
        torch.testing.assert_close(a, b, rtol=2e-6, atol=2e-6)  # exp/rsqrt: last-bit differences
    else:
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3)


def randn(*shape, dtype):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape))).to(DEVICE, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, width", [(1, 64), (7, 96), (3, 576)])
@pytest.mark.parametrize("with_delta", [True, False])
def test_add_rms_norm(dtype, rows, width, with_delta):
    x, w = randn(rows, width, dtype=dtype), randn(width, dtype=dtype)
    delta = randn(rows, width + 1, dtype=dtype)[:, :width].contiguous() if with_delta else None
    rx, rh = TorchOps().add_rms_norm(x.clone(), delta, w, 1e-5)
    tx, th = TritonOps().add_rms_norm(x.clone(), delta, w, 1e-5)
    same(tx, rx)
    same(th, rh)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads, kv_heads, d", [(4, 2, 32), (9, 3, 64), (8, 1, 128)])
def test_rope_on_q_and_k_in_the_fused_qkv(dtype, heads, kv_heads, d):
    T = 6
    qkv = randn(T, (heads + 2 * kv_heads) * d, dtype=dtype)
    angles = randn(40, d, dtype=torch.float32) * 3
    cos, sin = torch.cos(angles).to(dtype), torch.sin(angles).to(dtype)
    positions = torch.tensor([0, 5, 39, 1, 2, 17], device=DEVICE)
    ref = TorchOps().rope(qkv.clone()[:, : (heads + kv_heads) * d].view(T, -1, d), cos, sin, positions)
    mine = qkv.clone()
    out = TritonOps().rope(mine[:, : (heads + kv_heads) * d].view(T, -1, d), cos, sin, positions)
    same(out, ref)
    assert torch.equal(mine[:, (heads + kv_heads) * d :], qkv[:, (heads + kv_heads) * d :])  # v untouched


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, inter", [(1, 64), (5, 1500), (2, 2100)])
def test_silu_mul(dtype, rows, inter):
    gate_up = randn(rows, 2 * inter, dtype=dtype)
    same(TritonOps().silu_mul(gate_up), TorchOps().silu_mul(gate_up))


def test_empty_batches():
    ops = TritonOps()
    x = torch.empty(0, 64, device=DEVICE)
    assert ops.add_rms_norm(x, None, torch.ones(64, device=DEVICE), 1e-5)[1].shape == (0, 64)
    assert ops.silu_mul(torch.empty(0, 128, device=DEVICE)).shape == (0, 64)
