"""Host memory for the KV blocks of swapped-out sequences, and the copies to and from the cache.

Host layout: one tensor [num_host_blocks, layers, P, Q], so that a host block holds every layer of
one device block contiguously; P and Q come from the attention backend's `block_view` of a layer
([P, num_blocks, Q], block b is [:, b]). On CPU a copy is an index_select / index_copy_ per layer
between the two tensors. On a GPU the host tensor is pinned; a swap-out gathers the blocks of every
layer on the device into one staging tensor and copies each run of consecutive host blocks with
one non_blocking transfer (a swap-in does the reverse). Transfers and the forward that follows are
ordered on the same stream, and the CPU never touches the host blocks, so nothing waits.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch

from engine.attention import AttentionBackend
from engine.device import host_to_device
from engine.scheduler import SwapCost


class SwapSpace:
    def __init__(
        self, backend: AttentionBackend, kv_caches: list[torch.Tensor], block_size: int, num_host_blocks: int
    ):
        self.backend = backend
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.num_blocks = num_host_blocks
        self.device = kv_caches[0].device
        self.staged = self.device.type != "cpu"  # through a device staging tensor, for async transfers
        try:
            p, _, q = self._views()[0].shape
        except NotImplementedError:  # a cache layout without block views: no swapping
            if num_host_blocks:
                raise
            self.num_blocks, p, q = 0, 0, 0
        # empty, not zeros: pages are only committed as blocks are first written (on CPU)
        self.host = torch.empty(
            num_host_blocks,
            len(kv_caches),
            p,
            q,
            dtype=kv_caches[0].dtype,
            pin_memory=self.device.type == "cuda",
        )

    @property
    def block_bytes(self) -> int:
        return self.host[0].numel() * self.host.element_size() if self.num_blocks else 0

    def _views(self) -> list[torch.Tensor]:
        return [self.backend.block_view(c, self.block_size) for c in self.kv_caches]  # each [P, blocks, Q]

    def swap_out(self, pairs: list[tuple[int, int]]) -> None:
        """Copy device blocks to host blocks: pairs of (device block, host block)."""
        dev = host_to_device(torch.tensor([d for d, _ in pairs]), self.device)  # pinned: no wait
        host = [h for _, h in pairs]
        if not self.staged:
            idx = torch.tensor(host)
            for layer, view in enumerate(self._views()):
                self.host[:, layer].index_copy_(0, idx, view.index_select(1, dev).transpose(0, 1))
            return
        stage = torch.stack(
            [v.index_select(1, dev).transpose(0, 1) for v in self._views()], 1
        )  # [k, L, P, Q]
        for j, h, n in _runs(host):
            self.host[h : h + n].copy_(stage[j : j + n], non_blocking=True)

    def swap_in(self, pairs: list[tuple[int, int]]) -> None:
        """Copy host blocks back to device blocks: pairs of (host block, device block)."""
        host = [h for h, _ in pairs]
        dev = host_to_device(torch.tensor([d for _, d in pairs]), self.device)
        if not self.staged:
            idx = torch.tensor(host)
            for layer, view in enumerate(self._views()):
                view.index_copy_(1, dev, self.host[:, layer].index_select(0, idx).transpose(0, 1))
            return
        stage = torch.empty(
            (len(pairs),) + tuple(self.host.shape[1:]), dtype=self.host.dtype, device=self.device
        )
        for j, h, n in _runs(host):
            stage[j : j + n].copy_(self.host[h : h + n], non_blocking=True)
        for layer, view in enumerate(self._views()):
            view.index_copy_(1, dev, stage[:, layer].transpose(0, 1))

    def measure(self, max_blocks: int = 32, repeats: int = 3) -> SwapCost:
        """Time swapping 1 and k blocks out and back in (best of `repeats`, synchronized) and fit
        seconds = fixed_s + blocks * block_s. Copies blocks 0..k-1 onto themselves: call before use."""
        k = max(1, min(max_blocks, self.num_blocks, self.kv_caches[0].shape[-2] // self.block_size))

        def best(n: int) -> float:
            pairs = [(i, i) for i in range(n)]
            times = []
            for _ in range(repeats):
                self._sync()
                t = time.perf_counter()
                self.swap_out(pairs)
                self.swap_in(pairs)
                self._sync()
                times.append(time.perf_counter() - t)
            return min(times)

        one, many = best(1), best(k)
        block = (many - one) / (k - 1) if k > 1 else one
        block = max(block, many / k / 10, 1e-9)  # noise must not make blocks free
        return SwapCost(fixed_s=max(0.0, one - block), block_s=block)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _runs(ids: list[int]) -> Iterator[tuple[int, int, int]]:
    """(position, first id, length) of each run of consecutive ids."""
    start = 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or ids[i] != ids[i - 1] + 1:
            yield start, ids[start], i - start
            start = i
