"""Triton backend: the paged KV write, decode and prefill/extend attention as Triton kernels
(engine/kernels). Same cache layout as the torch reference ([2, KVH, slots, D]), so swapping and
the reference's tests apply unchanged.

Runs on a CUDA GPU; in triton's CPU interpreter (TRITON_INTERPRET=1) for tests. Triton is
imported when the backend is built, never when this module is imported, so that the interpreter
switch can still be set by whoever builds it first.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn.utils.rnn import pad_sequence

from engine.attention.base import AttentionMetadata, register_backend
from engine.attention.torch_ref import TorchAttention
from engine.device import host_to_device


@dataclass
class PackedPrefills:
    """The step's prefill chunks as the prefill kernel reads them."""

    block_tables: torch.Tensor  # [C, max_blocks] int64, padded with block 0 (never read)
    query_starts: torch.Tensor  # [C + 1] int64 rows of the packed batch
    context_lens: torch.Tensor  # [C] int64
    max_query_len: int


@register_backend("triton")
class TritonAttention(TorchAttention):
    supports_cuda_graphs = True
    triton_kernels = True
    MAX_GROUP = 64  # query heads per KV head one prefill tile can hold

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int):
        super().__init__(num_heads, num_kv_heads, head_dim)
        if head_dim & (head_dim - 1) or not 16 <= head_dim <= 256:
            raise ValueError(f"the triton backend needs a power-of-two head_dim in [16, 256], got {head_dim}")
        if num_heads // num_kv_heads > self.MAX_GROUP:
            raise ValueError(f"the triton backend supports at most {self.MAX_GROUP} query heads per KV head")
        from engine.kernels import kv_write, paged_decode, paged_prefill  # imports triton

        self.with_sinks = False  # whether a forward was given sinks (warm_up compiles their split decode)
        self._write = kv_write.kv_cache_write
        self._decode_kernel = paged_decode.paged_decode
        self._prefill_kernel = paged_prefill.paged_prefill

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        window: int = 0,
        softcap: float = 0.0,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if sinks is not None:
            sinks = sinks.to(torch.float32)  # [H]: a no-op for the fp32 logits the model keeps
            self.with_sinks = True
        self._write(k, v, kv_cache, meta.slot_mapping)
        out = torch.empty_like(q)
        nd = meta.num_decodes
        if nd:
            tables, context_lens = meta.decode_block_tables, meta.decode_context_lens
            assert tables is not None and context_lens is not None
            self._decode_kernel(
                q[:nd],
                kv_cache,
                tables,
                context_lens,
                meta.block_size,
                self.scale,
                out=out[:nd],
                window=window,
                softcap=softcap,
                sinks=sinks,
            )
        if meta.prefills:
            packed = meta.packed_prefills
            if not isinstance(packed, PackedPrefills):
                packed = meta.packed_prefills = pack_prefills(meta, q.device)
            self._prefill_kernel(
                q,
                kv_cache,
                packed.block_tables,
                packed.query_starts,
                packed.context_lens,
                packed.max_query_len,
                meta.block_size,
                self.scale,
                out=out,
                window=window,
                softcap=softcap,
                sinks=sinks,
            )
        return out


def pack_prefills(meta: AttentionMetadata, device: torch.device) -> PackedPrefills:
    chunks = meta.prefills
    if meta.prefill_block_tables is not None:  # gathered at once from the device-resident tables
        tables = meta.prefill_block_tables.to(device, non_blocking=True)
    elif all(c.block_ids.device.type == "cpu" for c in chunks):  # padded on the host, one copy
        tables = host_to_device(pad_sequence([c.block_ids.long() for c in chunks], batch_first=True), device)
    else:  # on the device already: one padding op, not a copy a chunk
        tables = pad_sequence([c.block_ids.long() for c in chunks], batch_first=True)
    starts = [c.start for c in chunks] + [chunks[-1].start + chunks[-1].num_tokens]
    return PackedPrefills(
        block_tables=tables,
        query_starts=host_to_device(torch.tensor(starts, dtype=torch.int64), device),
        context_lens=host_to_device(torch.tensor([c.context_len for c in chunks], dtype=torch.int64), device),
        max_query_len=max(c.num_tokens for c in chunks),
    )
