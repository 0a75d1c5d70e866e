"""Where the attention tests run the Triton backend: the GPU where there is one, else the CPU under
triton's interpreter (tests/engine/conftest.py sets TRITON_INTERPRET=1 only without a GPU). The
tests build their steps on the host; `forward` moves one there and the output back."""

from __future__ import annotations

from dataclasses import replace

import torch

from engine.attention import AttentionMetadata, make_backend

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def meta_to(meta: AttentionMetadata, device: torch.device) -> AttentionMetadata:
    """A copy of `meta` whose tensors live on `device` (the kernels' derived forms dropped)."""

    def on(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.to(device)

    return replace(
        meta,
        slot_mapping=meta.slot_mapping.to(device),
        decode_block_tables=on(meta.decode_block_tables),
        decode_context_lens=on(meta.decode_context_lens),
        prefills=[replace(c, block_ids=c.block_ids.to(device)) for c in meta.prefills],
        packed_prefills=None,
        decode_int32=None,
        sliding=None if meta.sliding is None else meta_to(meta.sliding, device),
    )


def forward(name: str, heads: int, kv_heads: int, head_dim: int, q, k, v, cache, meta, **kw) -> torch.Tensor:
    """The backend `name`'s forward of a host step; "triton" runs on DEVICE, the output comes back.
    The cache is written where the step runs: pass a clone."""
    device = DEVICE if name == "triton" else torch.device("cpu")
    backend = make_backend(name, heads, kv_heads, head_dim, device)
    if device.type == "cpu":
        return backend.forward(q, k, v, cache, meta, **kw)
    kw = {key: (x.to(device) if isinstance(x, torch.Tensor) else x) for key, x in kw.items()}
    moved = meta_to(meta, device)
    return backend.forward(q.to(device), k.to(device), v.to(device), cache.to(device), moved, **kw).cpu()
