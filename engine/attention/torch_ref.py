"""Reference attention in plain torch; runs on CPU and GPU.

Cache layout, per layer: [2, KVH, slots, D] (K then V, head-major). Gathering whole blocks of
one head is one contiguous copy of block_size * D values, and the gathered [KVH, B, L, D] is
already what SDPA wants, with no transpose. For decode, the G query heads that share a KV head
become G queries of one SDPA "head" (batch = KVH, heads = B), so GQA needs no repeat.
"""

from __future__ import annotations

import math
import mmap

import torch
import torch.nn.functional as F

from engine.attention.base import AttentionBackend, AttentionMetadata, register_backend


@register_backend("torch")
class TorchAttention(AttentionBackend):
    def allocate_cache(
        self, num_slots: int, dtype: torch.dtype, device: torch.device | str = "cpu"
    ) -> torch.Tensor:
        shape = (2, self.num_kv_heads, num_slots, self.head_dim)
        if torch.device(device).type != "cpu":
            return torch.zeros(shape, dtype=dtype, device=device)
        # Anonymous pages read as zeros and are committed only when first written: a cache larger
        # than its sequences ever fill costs neither the time to zero it nor the memory.
        pages = mmap.mmap(-1, math.prod(shape) * dtype.itemsize)
        return torch.frombuffer(pages, dtype=dtype).view(shape)

    def block_view(self, kv_cache: torch.Tensor, block_size: int) -> torch.Tensor:
        return kv_cache.view(2 * self.num_kv_heads, -1, block_size * self.head_dim)  # [2*KVH, blocks, bs*D]

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
        self.write_kv(k, v, kv_cache, meta.slot_mapping)
        out = torch.empty_like(q)
        nd = meta.num_decodes
        if nd:
            out[:nd] = self._decode(q[:nd], kv_cache, meta, window, softcap, sinks)
        self._prefill(q, k, v, kv_cache, meta, out, window, softcap, sinks)
        return out

    def write_kv(self, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slots: torch.Tensor) -> None:
        """The step's K and V rows [T, KVH, D] into kv_cache [2, KVH, S, D] at slots [T]."""
        kv_cache[0].index_copy_(1, slots, k.transpose(0, 1))
        kv_cache[1].index_copy_(1, slots, v.transpose(0, 1))

    def _prefill(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        out: torch.Tensor,
        window: int = 0,
        softcap: float = 0.0,
        sinks: torch.Tensor | None = None,
    ) -> None:
        """Each prefill chunk's rows of `out`: its queries over its own k, v or the cache (K/V written)."""
        head_sinks = None if sinks is None else sinks.view(1, -1, 1, 1)  # [1, H, 1, 1] over [1, H, n, L]
        for chunk in meta.prefills:
            rows = slice(chunk.start, chunk.start + chunk.num_tokens)
            if chunk.context_len == chunk.num_tokens:  # no cached prefix: attend within the chunk
                kc, vc = k[rows].transpose(0, 1), v[rows].transpose(0, 1)
            else:
                kv = _gather(kv_cache, chunk.block_ids, meta.block_size)[:, :, 0, : chunk.context_len]
                kc, vc = kv[0], kv[1]  # [KVH, L, D]
            mask = None
            if window or softcap or sinks is not None or chunk.context_len != chunk.num_tokens:
                mask = _causal_mask(chunk.num_tokens, chunk.context_len, q.device, window)
            qc = q[rows].transpose(0, 1)[None]  # [1, H, n, D]
            o = self._attend(qc, kc[None], vc[None], mask, softcap, head_sinks)
            out[rows] = o[0].transpose(0, 1)

    def _attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        softcap: float,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """q: [..., H, n, D], k and v: [..., KVH, L, D], mask [n, L] or broadcastable (None: causal);
        sinks: fp32 logits broadcastable to the scores' [..., H, n, 1] (None: no sinks)."""
        if not softcap and sinks is None:
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=mask is None, scale=self.scale, enable_gqa=True
            )
        # tanh soft-capping (Gemma 2) or attention sinks (gpt-oss), which SDPA cannot apply: the eager
        # product, its softmax in fp32
        assert mask is not None, "eager attention is always given its mask"
        g = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(g, dim=-3), v.repeat_interleave(g, dim=-3)
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.scale
        if softcap:
            scores = torch.tanh(scores / softcap) * softcap
        scores = scores.float().masked_fill(~mask, float("-inf"))
        if sinks is None:
            probs = torch.softmax(scores, dim=-1)
        else:  # the sink is one more logit of each head's softmax, with no value: dropped after it
            sink = sinks.float().expand(*scores.shape[:-1], 1)
            probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
        return torch.matmul(probs.to(q.dtype), v)

    def _decode(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        window: int = 0,
        softcap: float = 0.0,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        B, H, D = q.shape
        KVH = self.num_kv_heads
        tables, context_lens = meta.decode_block_tables, meta.decode_context_lens
        assert tables is not None and context_lens is not None, "a step without decodes"
        kv = _gather(kv_cache, tables.view(-1), meta.block_size, batch=B)  # [2, KVH, B, L, D]
        qg = q.view(B, KVH, H // KVH, D).transpose(0, 1)  # [KVH, B, G, D]
        L = tables.shape[1] * meta.block_size
        ctx = context_lens[:, None]
        keys = torch.arange(L, device=q.device)[None, :]
        visible = keys < ctx
        if window:  # a sliding layer: the last `window` keys, the query's own included
            visible &= keys >= ctx - window
        mask = visible[None, :, None, :]
        if softcap or sinks is not None:  # [KVH, B, G, D] as B*KVH single-KV-head attentions
            group_sinks = None if sinks is None else sinks.view(KVH, 1, 1, H // KVH, 1)
            o = self._attend(
                qg[:, :, None], kv[0][:, :, None], kv[1][:, :, None], mask[..., None, :], softcap, group_sinks
            )
            o = o[:, :, 0]
        else:
            o = F.scaled_dot_product_attention(qg, kv[0], kv[1], attn_mask=mask, scale=self.scale)
        return o.transpose(0, 1).reshape(B, H, D)  # o: [KVH, B, G, D]


def _gather(kv_cache: torch.Tensor, block_ids: torch.Tensor, block_size: int, batch: int = 1) -> torch.Tensor:
    """Whole blocks of every head: [2, KVH, batch, blocks_per_seq * block_size, D]."""
    two, kvh, slots, d = kv_cache.shape
    blocks = kv_cache.view(two * kvh, slots // block_size, block_size * d).index_select(1, block_ids)
    return blocks.view(two, kvh, batch, -1, d)


def _causal_mask(num_queries: int, context_len: int, device: torch.device, window: int = 0) -> torch.Tensor:
    """[n, L] True where query i (at position L - n + i) may see key j (within `window`, if set)."""
    q_pos = torch.arange(context_len - num_queries, context_len, device=device)[:, None]
    keys = torch.arange(context_len, device=device)[None, :]
    visible = keys <= q_pos
    return visible & (keys > q_pos - window) if window else visible
