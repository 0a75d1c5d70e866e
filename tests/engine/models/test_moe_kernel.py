"""csrc/moe_f32.c's arithmetic to the bit: an expert with 1 to 4 tokens (the grouped gemv path, several
panels side by side) and one with more (the register-tile micro-kernel) give a token the same output,
so a token's result does not depend on its batch; and the AVX2 build (every x86-64 CI machine's)
equals the AVX-512 build where the CPU has AVX-512."""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import pytest
import torch

from engine import native
from engine.models import moe
from engine.models.fused import TorchOps
from engine.models.linear import Linear, pack, unpack
from engine.models.ops import make_ops
from engine.models.spec import MoESpec

E, H, INTER = 8, 256, 200  # 2I = 400: 13 (AVX-512) or 25 (AVX2) panels, the last group partial


def _block(cpu_kernels: bool = True, bias: bool = True) -> moe.MoEBlock:
    torch.manual_seed(0)
    spec = MoESpec(num_experts=E, top_k=2, intermediate_size=INTER, norm_topk_prob=True, layers=(True,))
    gu, dn, router = torch.randn(E, 2 * INTER, H) * 0.1, torch.randn(E, H, INTER) * 0.1, torch.randn(E, H)
    b = (torch.randn(E, 2 * INTER), torch.randn(E, H)) if bias else (None, None)
    counter = moe.ExpertCounter("cpu")
    return moe.MoEBlock(spec, "silu", Linear(router), gu, dn, *b, counter, cpu_kernels=cpu_kernels)


@pytest.mark.parametrize("bias", [False, True])
def test_a_token_gets_the_same_bits_whatever_rows_its_experts_have(bias):
    c = _block(bias=bias)
    assert c.panels is not None
    ops = make_ops(torch.device("cpu"), torch.float32, True)
    h = torch.randn(48, H)
    full = c(h, ops)  # about 12 rows an expert: the micro-kernel
    torch.testing.assert_close(full, _block(False, bias)(h, TorchOps()), rtol=1e-4, atol=1e-4)
    for size in (1, 2, 3, 5, 16):  # 1 to 4 rows an expert mostly: the gemv path, whole groups or halves
        for start in range(0, 48 - size + 1, 7):
            assert torch.equal(c(h[start : start + size], ops), full[start : start + size]), (size, start)


def _build(tmp_path, name: str, extra: list[str]) -> ctypes.CDLL:
    so, obj = tmp_path / f"{name}.so", tmp_path / f"{name}.o"
    cc = shutil.which("gcc") or "cc"
    subprocess.run([cc, *native.FLAGS, *extra, "-c", "-o", str(obj), str(moe.SOURCE)], check=True)
    subprocess.run([cc, *native.LINK_FLAGS, "-o", str(so), str(obj), "-lm"], check=True)
    lib = ctypes.CDLL(str(so))
    lib.moe_f32.restype, lib.moe_f32.argtypes = None, [ctypes.c_void_p] * 13 + [ctypes.c_int] * 5
    lib.f32_panel_width.restype = ctypes.c_int
    return lib


@pytest.mark.skipif(b"avx512f" not in native._machine().split(), reason="the CPU has no AVX-512")
@pytest.mark.parametrize("vectorize", [True, False])
def test_avx2_build_equals_the_avx512_build(tmp_path, vectorize):
    """Every output is one FMA chain over k in either build: bit-identical where the compiler keeps
    the elementwise loops scalar; its vectorized expf (SiLU) differs by ulps between the two ISAs.
    In each build a token gets the same bits alone as in the batch."""
    block = _block()
    weights = _unpacked(block)
    ops = make_ops(torch.device("cpu"), torch.float32, True)
    h = torch.randn(24, H)
    outs = []
    for name, extra in (("avx512", []), ("avx2", ["-mno-avx512f"])):
        lib = _build(tmp_path, name, extra + ([] if vectorize else ["-fno-tree-vectorize"]))
        assert lib.f32_panel_width() == (32 if name == "avx512" else 16)
        block.lib = lib
        block.panels = (
            torch.stack([pack(lib, g) for g, _ in weights]),
            torch.stack([pack(lib, d) for _, d in weights]),
        )
        full = block(h, ops)
        assert torch.equal(block(h[:1], ops), full[:1]) and torch.equal(block(h[3:6], ops), full[3:6])
        outs.append(full)
    if vectorize:
        torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)
    else:
        assert torch.equal(outs[0], outs[1])


def _unpacked(block: moe.MoEBlock) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each expert's (gate_up [2I, H], down [H, I]) back from the block's panels."""
    assert block.panels is not None
    gu, dn = block.panels
    return [(unpack(gu[e], 2 * INTER).clone(), unpack(dn[e], H).clone()) for e in range(E)]
