"""The AVX512-VNNI INT8 kernel (engine/models/csrc/int8_vnni.c): its outputs are
`quant.reference`'s to the bit (exact int32 block sums, fp64 over the blocks) at odd and real
shapes, where int8_linear.c's differ by fp32 rounding; Int8Linear and the one-call decode forward
take it for every batch where the CPU has AVX512-VNNI; built without AVX512-VNNI the library
compiles and says it is unavailable (int8_linear.c then serves)."""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import pytest
import torch

from engine import LLM, native
from engine.models import quant

HAS_VNNI = quant.vnni_library() is not None
needs_vnni = pytest.mark.skipif(not HAS_VNNI, reason="the CPU lacks AVX512-VNNI")
# SmolLM2-135M's projections (qkv, o, gate_up, down) and shapes off the 32-channel panels
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536), (100, 96), (36, 64)]


def _call(kernel, x: torch.Tensor, weight: torch.Tensor, layer: quant.Int8Linear, bias) -> torch.Tensor:
    M, K = x.shape
    N = layer.scale.shape[0]
    y = torch.empty(M, N)
    b = bias.data_ptr() if bias is not None else None
    kernel(x.data_ptr(), weight.data_ptr(), layer.scale.data_ptr(), b, y.data_ptr(), M, N, K, 2)
    return y


def test_panels_round_trip():
    q = torch.randint(-127, 128, (100, 96), dtype=torch.int8)
    panels = quant.pack_panels(q)
    assert panels.shape == (4, 24, quant.PANEL, 4) and panels.dtype == torch.uint8
    assert torch.equal(quant.unpack_panels(panels, 100), q)


@needs_vnni
@pytest.mark.parametrize("N,K", SHAPES)
@pytest.mark.parametrize("with_bias", [True, False])
def test_kernel_equals_the_reference_to_the_bit(N, K, with_bias):
    torch.manual_seed(N + K)
    layer = quant.Int8Linear(torch.randn(N, K), torch.randn(N) if with_bias else None)
    assert layer.vnni is not None
    for M in (1, 7, 48, 130):
        x = torch.randn(M, K) * (10 ** torch.empty(M, 1).uniform_(-2, 2))
        y = _call(layer.vnni.int8_vnni_linear_f32, x, layer.kernel_weight, layer, layer.kernel_bias)
        assert torch.equal(y, quant.reference(x, layer.rows, layer.scale, layer.bias)), (M, N, K)


@needs_vnni
def test_int8_linear_takes_the_vnni_kernel_at_every_batch():
    torch.manual_seed(5)
    N, K = 960, 576
    layer = quant.Int8Linear(torch.randn(N, K), torch.randn(N))
    assert layer.vnni is not None and layer.kernel_weight.dtype == torch.uint8
    grouped = quant.pack(layer.rows)  # int8_linear.c's layout
    for M in (1, 5, 9, 48):
        x = torch.randn(M, K)
        old = _call(layer.lib.int8_linear_f32, x, grouped, layer, layer.kernel_bias)
        expected = quant.reference(x, layer.rows, layer.scale, layer.bias)
        y = layer(x)
        assert torch.equal(y, expected) and torch.equal(y[:1], layer(x[:1]))  # no row depends on M
        assert not torch.equal(old, expected)  # int8_linear.c rounds its fp32 sums otherwise
        assert torch.allclose(y, old, rtol=1e-5, atol=1e-5)


def test_builds_without_avx512_vnni(tmp_path):
    """An AVX2-only build: the library compiles and answers 0 (Int8Linear then keeps int8_linear.c)."""
    cc = shutil.which("gcc") or "cc"
    for name, extra in [("novnni", ["-mno-avx512vnni"]), ("avx2", ["-mno-avx512f"])]:
        obj, so = tmp_path / f"{name}.o", tmp_path / f"{name}.so"
        cmd = [cc, *native.FLAGS, *extra, "-c", "-o", str(obj), str(quant.VNNI_SOURCE)]
        subprocess.run(cmd, check=True, capture_output=True)
        subprocess.run(
            [cc, *native.LINK_FLAGS, "-o", str(so), str(obj), "-lm"], check=True, capture_output=True
        )
        lib = ctypes.CDLL(str(so))
        lib.int8_vnni_available.restype = ctypes.c_int
        assert lib.int8_vnni_available() == 0


@needs_vnni
def test_decode_forward_runs_the_vnni_kernel(tiny_model_dir):
    """(tests/engine/models/test_decode.py checks its outputs against the per-operator forward)"""
    llm = LLM(model=str(tiny_model_dir), dtype="float32", num_threads=2, quantization="int8")
    decode = llm.engine.runner.model.decode
    assert decode is not None and decode.int8_kernel == 2
