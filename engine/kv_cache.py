"""The KV cache tensors and host swap space of a model runner, in one pool or two.

One pool: every layer's cache has `num_blocks` blocks. Two pools (a model mixing sliding and full
layers, engine/kv_groups.py): the full layers' caches have `num_blocks` blocks, the sliding layers'
`num_sliding_blocks`, each pool with its own host swap space; the cache budget (kv_cache_gib, or
num_kv_blocks full-pool blocks) is split so that the sliding pool gets what it can use.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.attention import AttentionBackend
from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.kv_groups import (
    SLIDING_TABLE,
    HybridBlockManager,
    sliding_pool_blocks,
    split_budget,
    split_pairs,
)
from engine.models.spec import ModelSpec
from engine.swap_space import SwapSpace

Pairs = list[tuple[int, int]]  # (source block, destination block) copies


@dataclass
class KVCache:
    kv_caches: list[torch.Tensor]  # one per layer, in the backend's layout
    num_blocks: int  # blocks of the (full) pool
    swap_space: SwapSpace  # host blocks of the (full) pool
    sliding_window: int = 0  # > 0: the sliding layers have a pool of their own
    num_sliding_blocks: int = 0
    sliding_swap: SwapSpace | None = None

    def swap_out(self, pairs: list[tuple[int, int]]) -> None:
        """Copy (device block, host block) pairs, in the shared id space of both pools."""
        full, sliding = self._split(pairs, swap_in=False)
        if full:
            self.swap_space.swap_out(full)
        if sliding and self.sliding_swap is not None:
            self.sliding_swap.swap_out(sliding)

    def swap_in(self, pairs: list[tuple[int, int]]) -> None:
        """Copy (host block, device block) pairs, in the shared id space of both pools."""
        full, sliding = self._split(pairs, swap_in=True)
        if full:
            self.swap_space.swap_in(full)
        if sliding and self.sliding_swap is not None:
            self.sliding_swap.swap_in(sliding)

    def _split(self, pairs: Pairs, swap_in: bool) -> tuple[Pairs, Pairs]:
        if self.sliding_swap is None:
            return pairs, []
        return split_pairs(pairs, self.num_blocks, self.swap_space.num_blocks, swap_in)


def allocate_kv_cache(
    config: EngineConfig,
    spec: ModelSpec,
    backend: AttentionBackend,
    dtype: torch.dtype,
    device: torch.device,
) -> KVCache:
    """The caches of every layer and the host swap space, as the config and the model ask."""
    bs, layers = config.block_size, spec.num_layers
    layer_block = 2 * bs * spec.num_kv_heads * spec.head_dim * dtype.itemsize  # bytes, one layer

    def layer_blocks(gib: float) -> int:
        return int(gib * 2**30 // layer_block)

    window = spec.split_window if config.sliding_pool else 0
    sliding = [i for i in range(layers) if window and spec.layer_window(i)]
    n_slide, n_full = len(sliding), layers - len(sliding)
    if window:
        need = sliding_pool_blocks(
            10**12, bs, window, config.max_num_seqs, config.max_num_batched_tokens
        )  # what the sliding pool can use, whatever the budget
        if config.num_kv_blocks:
            num_blocks, num_sliding = config.num_kv_blocks, min(config.num_kv_blocks, need)
        else:
            num_blocks, num_sliding = split_budget(layer_blocks(config.kv_cache_gib), n_full, n_slide, need)
        num_blocks, num_sliding = max(1, num_blocks), max(1, num_sliding)
    else:
        num_blocks = config.num_kv_blocks or max(1, layer_blocks(config.kv_cache_gib) // layers)
        num_sliding = 0
    kv_caches = [
        backend.allocate_cache((num_sliding if i in sliding else num_blocks) * bs, dtype, device)
        for i in range(layers)
    ]
    if config.preemption_mode == "recompute":
        host, host_sliding = 0, 0
    elif config.num_swap_blocks is not None:
        host = host_sliding = config.num_swap_blocks
    elif window:
        host, host_sliding = split_budget(layer_blocks(config.swap_space_gib), n_full, n_slide, num_sliding)
    else:
        host = host_sliding = layer_blocks(config.swap_space_gib) // layers
    if config.preemption_mode == "auto" and type(backend).block_view is AttentionBackend.block_view:
        host = host_sliding = 0  # this backend's cache layout cannot be swapped: recompute only
    if not window:
        return KVCache(kv_caches, num_blocks, SwapSpace(backend, kv_caches, bs, host))
    full_caches = [c for i, c in enumerate(kv_caches) if i not in sliding]
    sliding_caches = [kv_caches[i] for i in sliding]
    if not host or not host_sliding:
        host = host_sliding = 0  # a sequence swaps out of both pools or neither
    return KVCache(
        kv_caches,
        num_blocks,
        SwapSpace(backend, full_caches, bs, host),
        window,
        num_sliding,
        SwapSpace(backend, sliding_caches, bs, host_sliding),
    )


def make_block_manager(
    cache: KVCache, block_size: int, *, enable_prefix_caching: bool, window: int
) -> BlockManager | HybridBlockManager:
    """The block manager over the cache's pool(s). `window`: every layer slides (one pool whose
    blocks are released out of the window)."""
    full = BlockManager(
        cache.num_blocks,
        block_size,
        enable_prefix_caching=enable_prefix_caching,
        num_host_blocks=cache.swap_space.num_blocks,
        sliding_window=window,
    )
    if cache.sliding_swap is None:
        return full
    sliding = BlockManager(
        cache.num_sliding_blocks,
        block_size,
        enable_prefix_caching=enable_prefix_caching,
        num_host_blocks=cache.sliding_swap.num_blocks,
        sliding_window=cache.sliding_window,
        table=SLIDING_TABLE,
    )
    return HybridBlockManager(full, sliding)
