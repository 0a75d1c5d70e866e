"""The fp32 CPU linear kernel (engine/models/csrc/f32_linear.c) computes F.linear to fp32 rounding
at any batch (tiles of 1 to MR rows, blocks of rows for long inputs), with and without bias, at any
N (a last panel padded) and K; a row's result does not depend on the batch it is in; the weight is
kept only in the kernel's panels; cpu_kernels=False and other dtypes take F.linear itself."""

import pytest
import torch
import torch.nn.functional as F

from engine.models import linear


@pytest.mark.parametrize("M", [1, 2, 3, 4, 5, 8, 17, 32, 131])
@pytest.mark.parametrize("N,K", [(12, 40), (7, 33), (64, 576), (21, 5)])
def test_kernel_equals_f_linear(M, N, K):
    torch.manual_seed(M * 1000 + N + K)
    w, x, bias = torch.randn(N, K), torch.randn(M, K), torch.randn(N)
    layer = linear.Linear(w, bias)
    assert layer.lib is not None  # a C compiler is on every machine this suite runs on
    assert torch.allclose(layer(x), F.linear(x, w, bias), rtol=1e-5, atol=1e-4)
    assert torch.allclose(linear.Linear(w)(x), F.linear(x, w), rtol=1e-5, atol=1e-4)
    assert torch.allclose(
        layer(x.t().contiguous().t()), F.linear(x, w, bias), rtol=1e-5, atol=1e-4
    )  # strided x


def test_a_row_does_not_depend_on_its_batch():
    torch.manual_seed(3)
    w, x = torch.randn(50, 96), torch.randn(200, 96)
    layer = linear.Linear(w)
    full = layer(x)
    for m in (1, 2, 5, 7, 13):
        assert torch.equal(layer(x[:m]), full[:m])
    assert torch.equal(layer(x[150:151]), full[150:151])


def test_the_panels_are_the_only_copy():
    torch.manual_seed(4)
    w = torch.randn(37, 64)
    layer = linear.Linear(w)
    assert layer.panels.shape[0] * layer.panels.shape[2] >= 37 and layer._weight is None
    assert torch.equal(layer.weight, w)  # unpacked on demand


def test_switched_off_takes_f_linear():
    torch.manual_seed(0)
    w, x = torch.randn(24, 48), torch.randn(3, 48)
    off = linear.Linear(w, cpu_kernel=False)
    assert off.lib is None and torch.equal(off(x[:3]), F.linear(x[:3], w))
    assert linear.Linear(w.to(torch.bfloat16)).lib is None  # fp32 only
