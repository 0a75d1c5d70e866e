"""The INT8 kernel's arithmetic to the bit: it rounds the activations as `quant.reference` does
(ties of x / d included), and its VNNI path (`vpdpbusd`, where the CPU has AVX512-VNNI or
AVX-VNNI) gives bit-identical results to the AVX2 path that every x86-64 CI machine runs."""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import pytest
import torch

from engine import native
from engine.models import quant


def test_kernel_rounds_activations_as_the_reference():
    # identity weights: y[m, j] = xq[m, j] * d[m] * 127 * scale[j], so y gives the kernel's xq back
    layer = quant.Int8Linear(torch.eye(32))
    assert layer.lib is not None
    torch.manual_seed(0)
    x = torch.randn(256, 32) * (10 ** torch.empty(256, 1).uniform_(-3, 2))
    _, d = quant.quantize_activations(x)
    for values in (x, torch.round(x / d * 2) / 2 * d):  # as drawn, and snapped to ties of x / d
        xq, d = quant.quantize_activations(values)
        kernel_xq = torch.round(layer(values) / (d * 127 * layer.scale[None, :]))
        assert torch.equal(kernel_xq, xq.float())


def _build(tmp_path, name: str, extra: list[str]) -> ctypes.CDLL:
    so, obj = tmp_path / f"{name}.so", tmp_path / f"{name}.o"
    cc = shutil.which("gcc") or "cc"
    # compiled with the engine's flags, linked without -ffast-math as engine/native.py links (a
    # fast-math link adds crtfastmath.o, which flushes subnormals for the whole test process)
    compile_cmd = [cc, *native.FLAGS, *extra, "-c", "-o", str(obj), str(quant.SOURCE)]
    subprocess.run(compile_cmd, check=True, capture_output=True)
    subprocess.run([cc, *native.LINK_FLAGS, "-o", str(so), str(obj), "-lm"], check=True, capture_output=True)
    lib = ctypes.CDLL(str(so))
    lib.int8_linear_f32.restype, lib.int8_linear_f32.argtypes = (
        None,
        [ctypes.c_void_p] * 5 + [ctypes.c_int] * 4,
    )
    return lib


def _has_vnni() -> bool:
    flags = native._machine().split()
    return b"avx512_vnni" in flags or b"avx_vnni" in flags


@pytest.mark.skipif(not _has_vnni(), reason="the CPU has neither AVX512-VNNI nor AVX-VNNI")
def test_vnni_path_is_bit_identical_to_the_avx2_path(tmp_path):
    vnni = _build(tmp_path, "vnni", [])
    avx2 = _build(tmp_path, "avx2", ["-mno-avx512vnni", "-mno-avxvnni"])
    torch.manual_seed(3)
    for M, N, K in [(1, 64, 576), (2, 20, 96), (5, 64, 576), (17, 36, 64), (32, 128, 1536)]:
        layer = quant.Int8Linear(torch.randn(N, K), torch.randn(N))
        x = torch.randn(M, K)
        grouped = quant.pack(layer.rows)  # int8_linear.c's layout
        ys = []
        for lib in (vnni, avx2):
            y = torch.empty(M, N)
            args = (x.data_ptr(), grouped.data_ptr(), layer.scale.data_ptr(), layer._bias32.data_ptr())
            lib.int8_linear_f32(*args, y.data_ptr(), M, N, K, 2)
            ys.append(y)
        assert torch.equal(ys[0], ys[1]), (M, N, K)
        assert torch.allclose(
            ys[0], quant.reference(x, layer.rows, layer.scale, layer.bias), rtol=1e-5, atol=1e-4
        )
