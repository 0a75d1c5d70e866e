"""Reference attention in plain torch; runs on CPU and GPU."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.attention.base import AttentionBackend, AttentionMetadata, register_backend


@register_backend("torch")
class TorchAttention(AttentionBackend):
    def forward(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
        k_cache.index_copy_(0, meta.slot_mapping, k)
        v_cache.index_copy_(0, meta.slot_mapping, v)
        out = torch.empty_like(q)
        nd = meta.num_decodes
        if nd:
            out[:nd] = self._decode(q[:nd], k_cache, v_cache, meta.decode_slots, meta.decode_mask)
        for chunk in meta.prefills:
            rows = slice(chunk.start, chunk.start + chunk.num_tokens)
            if chunk.context_slots is None:  # no cached prefix: attend within the chunk
                kc, vc, mask = k[rows], v[rows], None
            else:
                kc, vc = k_cache[chunk.context_slots], v_cache[chunk.context_slots]
                mask = _causal_mask(chunk.num_tokens, chunk.context_len, q.device)
            out[rows] = self._prefill(q[rows], kc, vc, mask)
        return out

    def _decode(self, q, k_cache, v_cache, slots, mask) -> torch.Tensor:
        # q: [B, H, D]; slots: [B, L]; gathered k/v: [B, L, KVH, D] -> [B, KVH, L, D]
        kc = k_cache[slots].transpose(1, 2)
        vc = v_cache[slots].transpose(1, 2)
        o = F.scaled_dot_product_attention(q.unsqueeze(2), kc, vc, attn_mask=mask, scale=self.scale, enable_gqa=True)
        return o.squeeze(2)  # [B, H, D]

    def _prefill(self, q, k, v, mask) -> torch.Tensor:
        # q: [n, H, D]; k, v: [L, KVH, D] -> SDPA wants [1, heads, tokens, D]
        qh, kh, vh = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        o = F.scaled_dot_product_attention(
            qh, kh, vh, attn_mask=mask, is_causal=mask is None, scale=self.scale, enable_gqa=True
        )
        return o.squeeze(0).transpose(0, 1)  # [n, H, D]


def _causal_mask(num_queries: int, context_len: int, device) -> torch.Tensor:
    """[n, L] True where query i (at position L - n + i) may see key j."""
    q_pos = torch.arange(context_len - num_queries, context_len, device=device)
    return torch.arange(context_len, device=device)[None, :] <= q_pos[:, None]
