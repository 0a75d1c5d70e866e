"""The CPU KV cache: anonymous pages that read as zeros (attention over a partly filled block reads
its unwritten slots) and take the values written to them."""

from __future__ import annotations

import torch

from engine.attention.torch_ref import TorchAttention


def test_a_cpu_cache_reads_as_zeros_and_keeps_what_is_written():
    backend = TorchAttention(num_heads=4, num_kv_heads=2, head_dim=8)
    for dtype in (torch.float32, torch.bfloat16):
        cache = backend.allocate_cache(64, dtype)
        assert cache.shape == (2, 2, 64, 8) and cache.dtype == dtype and cache.is_contiguous()
        assert torch.count_nonzero(cache) == 0
        cache[1, 0, 5] = 3.0
        view = backend.block_view(cache, 16)  # [2*KVH, blocks, bs*D]
        assert view[2, 0, 5 * 8 : 6 * 8].eq(3.0).all() and torch.count_nonzero(view) == 8
