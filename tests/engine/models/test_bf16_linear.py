"""bf16 linears on CPU (engine/models/bf16_linear.py): where the CPU has AVX512-BF16 (`vdpbf16ps`)
or AVX2 (fp32 FMAs over the widened weights) the C kernel over packed panels agrees with torch's
bf16 matmul within bf16 rounding, for any batch, ragged output widths and a bias; elsewhere the
layer keeps torch's matmul. The AVX2 kernel is also built and checked on AVX-512 CPUs. With AMX
(`cpu_amx`, forced here on any CPU whose oneDNN packs bf16) calls of 3 rows or more go to a oneDNN
copy of the weight."""

from __future__ import annotations

import ctypes
import platform
import shutil
import subprocess

import pytest
import torch
import torch.nn.functional as F

from engine import native
from engine.models import bf16_linear
from engine.models.linear import Linear, _onednn_pack

HAS_BF16 = bf16_linear.bf16_library() is not None
needs_bf16 = pytest.mark.skipif(not HAS_BF16, reason="the CPU has neither AVX512-BF16 nor AVX2")
# oneDNN packs bf16 weights only with AVX512 (BW, VL, DQ) or AVX-NE-CONVERT: not on AVX2 CPUs
ONEDNN_BF16 = (
    torch.backends.mkldnn.is_available() and _onednn_pack(torch.zeros(32, 32).bfloat16(), None) is not None
)
HAS_AMX = HAS_BF16 and bool(bf16_linear.bf16_library().bf16_amx_available())
needs_amx = pytest.mark.skipif(not HAS_AMX, reason="the CPU (or the compiler) has no AMX")


def test_pack_round_trips():
    w = torch.randn(70, 48).bfloat16()
    packed = bf16_linear.pack(w)
    assert packed.shape == (3, 24, 32, 2)
    assert torch.equal(bf16_linear.unpack(packed, 70), w)


@needs_bf16
@pytest.mark.parametrize("M", [1, 2, 7, 8, 9, 33, 200])
@pytest.mark.parametrize("N,K,bias", [(32, 64, False), (70, 96, True), (1536, 576, False), (100, 2, True)])
def test_kernel_matches_torch_within_bf16_rounding(M, N, K, bias):
    torch.manual_seed(M + N + K)
    w, x = torch.randn(N, K).bfloat16(), torch.randn(M, K).bfloat16()
    b = torch.randn(N).bfloat16() if bias else None
    layer = Linear(w, b, cpu_amx=False)
    assert layer.bf16 is not None and layer._weight is None and layer.packed is None  # the only copy
    y = layer(x)
    assert y.dtype == torch.bfloat16 and y.shape == (M, N)
    exact = F.linear(x.double(), w.double(), b.double() if bias else None)
    ours, theirs = (y.double() - exact).abs(), (F.linear(x, w, b).double() - exact).abs()
    # fp32 sums rounded once to bf16: within one bf16 step (2^-8 relative) of the exact value
    assert (ours <= exact.abs() * 2**-8 + 1e-3 * K**0.5).all()
    assert ours.mean() <= 1.5 * theirs.mean() + 1e-6
    assert torch.equal(layer.weight, w)


@needs_bf16
def test_a_row_does_not_depend_on_its_batch():
    torch.manual_seed(0)
    layer = Linear(torch.randn(96, 128).bfloat16(), cpu_amx=False)
    x = torch.randn(17, 128).bfloat16()
    assert torch.equal(layer(x)[5:6], layer(x[5:6]))


@needs_bf16
@pytest.mark.skipif(not ONEDNN_BF16, reason="torch without oneDNN, or a oneDNN that packs no bf16 here")
@pytest.mark.parametrize("bias", [False, True])
def test_with_amx_few_rows_run_the_kernel_and_many_run_onednn(bias):
    torch.manual_seed(1)
    w, x = torch.randn(70, 96).bfloat16(), torch.randn(40, 96).bfloat16()
    b = torch.randn(70).bfloat16() if bias else None
    amx, kernel = Linear(w, b, cpu_amx=True), Linear(w, b, cpu_amx=False)
    assert amx.onednn_rows == bf16_linear.ONEDNN_MIN_ROWS == 3 and amx.packed is not None
    assert kernel.onednn_rows is None and kernel.packed is None
    for m in (1, 2):  # below the threshold: the C kernel, bit for bit
        assert torch.equal(amx(x[:m]), kernel(x[:m]))
    exact = F.linear(x.double(), w.double(), b.double() if bias else None)
    for m in (3, 8, 40):  # oneDNN's packed copy: torch's own bf16 matmul, within one bf16 step
        y = amx(x[:m])
        assert torch.equal(y, torch.ops.mkldnn._linear_pointwise(x[:m], amx.packed, b, "none", [], ""))
        assert ((y.double() - exact[:m]).abs() <= exact[:m].abs() * 2**-8 + 1e-3 * 96**0.5).all()
    assert torch.equal(amx.weight, w)
    assert bf16_linear.onednn_rows(False) is None
    assert bf16_linear.onednn_rows(None) == (3 if bf16_linear.cpu_has_amx_bf16() else None)


@needs_amx
@pytest.mark.parametrize("M", [3, 15, 16, 17, 31, 32, 40, 64])
@pytest.mark.parametrize("N,K,bias", [(960, 576, False), (70, 96, True), (576, 1536, False), (100, 64, True)])
def test_amx_kernel_is_torchs_bf16_linear_bit_for_bit(M, N, K, bias):
    """bf16_amx.c over the panels: fp32 sums of the tiles' products over k in order, rounded once
    (as oneDNN's AMX kernels under torch's bf16 F.linear sum and round up to 32 rows), whatever the
    padding of rows (to 16) and channels (to 32)."""
    torch.manual_seed(M * N + K)
    w, x = torch.randn(N, K).bfloat16(), torch.randn(M, K).bfloat16()
    b = torch.randn(N).bfloat16() if bias else None
    layer = Linear(w, b, cpu_amx=True)
    assert layer.bf16.amx and bf16_linear.ONEDNN_MIN_ROWS <= M <= layer.bf16.amx_max_rows
    y = layer.bf16.run(x, amx=True)
    assert torch.equal(y, torch.cat([F.linear(x[i : i + 16], w, b) for i in range(0, M, 16)]))
    assert torch.equal(layer(x), y)  # the layer's choice for these rows (N <= 2 K: up to 64)


@needs_amx
def test_wide_layers_hand_more_than_32_rows_to_onednn():
    torch.manual_seed(3)
    w, x = torch.randn(400, 64).bfloat16(), torch.randn(40, 64).bfloat16()
    layer = Linear(w, cpu_amx=True)
    assert layer.bf16.amx_max_rows == bf16_linear.AMX_MAX_ROWS == 32
    assert torch.equal(layer(x), torch.ops.mkldnn._linear_pointwise(x, layer.packed, None, "none", [], ""))
    assert torch.equal(layer(x[:32]), layer.bf16.run(x[:32], amx=True))


@needs_amx
def test_amx_rows_do_not_depend_on_their_batch():
    torch.manual_seed(2)
    layer = Linear(torch.randn(200, 576).bfloat16(), cpu_amx=True)
    x = torch.randn(32, 576).bfloat16()
    full = layer.bf16.run(x, amx=True)
    for m in (3, 17, 20):
        assert torch.equal(layer.bf16.run(x[:m], amx=True), full[:m])


def test_without_the_kernel_the_layer_is_torch():
    w, x = torch.randn(40, 64).bfloat16(), torch.randn(3, 64).bfloat16()
    layer = Linear(w, cpu_kernel=False)
    assert layer.bf16 is None
    assert torch.equal(layer(x), F.linear(x, w))
    assert bf16_linear.BF16Panels.make(torch.randn(4, 7).bfloat16(), None) is None  # odd K: torch


@pytest.fixture(scope="module")
def avx2_lib(tmp_path_factory) -> ctypes.CDLL:
    """bf16_linear.c built for AVX2 + FMA alone (x86-64-v3), whatever this CPU has beyond them."""
    tmp_path = tmp_path_factory.mktemp("avx2")
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None or platform.machine() != "x86_64" or "avx2" not in open("/proc/cpuinfo").read():
        pytest.skip("needs gcc on an x86-64 CPU with AVX2")
    flags = [f for f in native.FLAGS if not f.startswith("-march")] + ["-march=x86-64-v3"]
    lib_path = tmp_path / "bf16_linear_avx2.so"
    subprocess.run([cc, *flags, "-shared", "-o", str(lib_path), str(bf16_linear.SOURCE)], check=True)
    lib = ctypes.CDLL(str(lib_path))
    lib.bf16_linear.restype, lib.bf16_linear.argtypes = None, [ctypes.c_void_p] * 4 + [ctypes.c_int] * 4
    lib.bf16_panel_width.restype = lib.bf16_linear_available.restype = ctypes.c_int
    return lib


@pytest.mark.parametrize("M", [1, 2, 3, 4, 97, 200])
@pytest.mark.parametrize("N,K,bias", [(32, 64, False), (70, 96, True), (1536, 576, False), (100, 2, True)])
def test_avx2_kernel_matches_torch_within_bf16_rounding(avx2_lib, M, N, K, bias):
    """The AVX2 micro-kernel (built for x86-64-v3 on any AVX2 CPU, AVX-512 ones included): the same
    panels, fp32 sums of exact products rounded once, within one bf16 step of the exact value and,
    where this CPU also runs the AVX512-BF16 kernel, within one bf16 step of it."""
    lib = avx2_lib
    assert lib.bf16_linear_available() == 1 and lib.bf16_panel_width() == 32
    torch.manual_seed(M * 7 + N + K)
    w, x = torch.randn(N, K).bfloat16(), torch.randn(M, K).bfloat16()
    b = torch.randn(N).bfloat16() if bias else None
    panels = bf16_linear.pack(w, 32)
    y = torch.empty(M, N, dtype=torch.bfloat16)
    lib.bf16_linear(x.data_ptr(), panels.data_ptr(), b.data_ptr() if bias else None, y.data_ptr(), M, N, K, 2)
    exact = F.linear(x.double(), w.double(), b.double() if bias else None)
    assert ((y.double() - exact).abs() <= exact.abs() * 2**-8 + 1e-3 * K**0.5).all()
    rounded = F.linear(x.float(), w.float(), b.float() if bias else None).bfloat16()
    # torch's fp32 sums rounded once: the same but where another summation order crosses a tie
    assert (y != rounded).float().mean() <= 1e-3
    if HAS_BF16:
        native_y = Linear(w, b, cpu_amx=False)(x)
        apart = (y.double() - native_y.double()).abs()
        assert (apart <= native_y.double().abs() * 2**-7 + 1e-3 * K**0.5).all()
