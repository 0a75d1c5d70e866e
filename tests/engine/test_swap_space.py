"""SwapSpace copies blocks to host memory and back exactly, directly (CPU) or staged (a GPU's way)."""

import pytest
import torch

from engine.attention import AttentionBackend, make_backend
from engine.swap_space import SwapSpace


@pytest.mark.parametrize("staged", [False, True])
def test_blocks_survive_a_trip_to_host_memory(staged):
    backend = make_backend("torch", num_heads=4, num_kv_heads=2, head_dim=8)
    caches = [torch.randn(2, 2, 10 * 4, 8) for _ in range(3)]  # 3 layers, 10 blocks of 4 slots
    swap = SwapSpace(backend, caches, block_size=4, num_host_blocks=6)
    swap.staged = staged  # on CPU the staged path runs with ordinary tensors
    before = [c.clone() for c in caches]
    out = [(7, 4), (2, 5), (9, 0), (3, 1)]  # runs of consecutive host blocks: [4, 5] and [0, 1]
    swap.swap_out(out)
    for c in caches:
        c.zero_()
    back = [(4, 1), (5, 8), (0, 0), (1, 6)]  # to other device blocks
    swap.swap_in(back)
    for c, b in zip(caches, before):
        for (src, _host), (_, dst) in zip(out, back):
            assert torch.equal(c[:, :, dst * 4 : dst * 4 + 4], b[:, :, src * 4 : src * 4 + 4])
        untouched = [i for i in range(10) if i not in (1, 8, 0, 6)]
        assert all(not c[:, :, i * 4 : i * 4 + 4].any() for i in untouched)
    assert swap.block_bytes == 3 * 2 * 2 * 4 * 8 * 4


def test_measure_gives_positive_costs():
    backend = make_backend("torch", num_heads=4, num_kv_heads=2, head_dim=8)
    swap = SwapSpace(backend, [torch.zeros(2, 2, 64, 8)], block_size=4, num_host_blocks=8)
    cost = swap.measure()
    assert cost.block_s > 0 and cost.fixed_s >= 0


def test_a_backend_without_block_views_cannot_swap():
    class NoViews(type(make_backend("torch", 4, 2, 8))):
        block_view = AttentionBackend.block_view  # the interface's default: no view

    backend = NoViews(4, 2, 8)
    assert SwapSpace(backend, [torch.zeros(2, 2, 16, 8)], block_size=4, num_host_blocks=0).num_blocks == 0
    with pytest.raises(NotImplementedError):
        SwapSpace(backend, [torch.zeros(2, 2, 16, 8)], block_size=4, num_host_blocks=2)
