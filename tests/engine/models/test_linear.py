"""The fp32 CPU linear kernel (engine/models/csrc/f32_linear.c) computes F.linear to fp32 rounding
at any batch (tiles of 1 to 4 rows, passes of 64 rows), with and without bias, at any K (tails of
fewer than a vector included); cpu_kernels=False and other dtypes take F.linear itself."""
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
    assert torch.allclose(layer(x.t().contiguous().t()), F.linear(x, w, bias), rtol=1e-5, atol=1e-4)  # strided x


def test_switched_off_takes_f_linear():
    torch.manual_seed(0)
    w, x = torch.randn(24, 48), torch.randn(3, 48)
    off = linear.Linear(w, cpu_kernel=False)
    assert off.lib is None and torch.equal(off(x[:3]), F.linear(x[:3], w))
    assert linear.Linear(w.to(torch.bfloat16)).lib is None  # fp32 only
