"""The Triton KV-cache write puts each token's K/V at its slot, for every head, and skips slot -1."""

import pytest
import torch
from kernel_reference import DEVICE

from engine.kernels.kv_write import kv_cache_write


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kvh,d", [(1, 64), (3, 64), (8, 128)])
def test_write_matches_index_copy(dtype, kvh, d):
    gen = torch.Generator().manual_seed(kvh * d)
    slots = 96
    qkv = torch.randn(7, 2 + 2 * kvh, d, generator=gen).to(dtype)  # k, v as strided views, like the model's
    k, v = qkv[:, 2 : 2 + kvh], qkv[:, 2 + kvh :]
    slot_mapping = torch.tensor([5, 90, -1, 17, 0, 63, 40])
    cache = torch.randn(2, kvh, slots, d, generator=gen).to(dtype)
    expected = cache.clone()
    keep = slot_mapping >= 0
    expected[0][:, slot_mapping[keep]] = k[keep].transpose(0, 1)
    expected[1][:, slot_mapping[keep]] = v[keep].transpose(0, 1)
    on_device = cache.to(DEVICE)
    kv_cache_write(k.to(DEVICE), v.to(DEVICE), on_device, slot_mapping.to(DEVICE))
    assert torch.equal(on_device.cpu(), expected)
