"""Sliding windows and soft-capping in every attention backend: the C kernel (cpu) and the Triton
kernels (interpreter on CPU) against the torch reference (which the model families hold to
transformers), for decodes and for prefill chunks with and without a cached prefix."""

from __future__ import annotations

import pytest
import torch
from triton_device import forward

from engine.attention import AttentionMetadata, PrefillChunk, make_backend

H, KVH, D, BS = 4, 2, 16, 8


def _step(gen, cache_len: int = 40):
    """A step of 2 decodes (contexts 37 and 12) and 2 prefill chunks (fresh 19 tokens; 9 tokens
    over a cached 21), every sequence on its own shuffled blocks of a shared cache."""
    decodes, chunks = [37, 12], [(0, 19), (21, 9)]  # context lengths; (cached prefix, new tokens)
    lens = decodes + [p + n for p, n in chunks]
    blocks = torch.randperm(sum(-(-n // BS) for n in lens) + 2, generator=gen)
    tables, used = [], 0
    for n in lens:
        nb = -(-n // BS)
        tables.append(blocks[used : used + nb])
        used += nb
    num_slots = (len(blocks)) * BS
    width = max(len(t) for t in tables[:2])
    dec_tables = torch.stack([torch.cat([t, t.new_zeros(width - len(t))]) for t in tables[:2]])
    slots, prefills, row = [], [], 2
    for i, n in enumerate(decodes):
        slots.append(int(tables[i][(n - 1) // BS]) * BS + (n - 1) % BS)
    for (p, n), table in zip(chunks, tables[2:]):
        all_slots = (table[:, None] * BS + torch.arange(BS)).reshape(-1)
        slots += all_slots[p : p + n].tolist()
        prefills.append(PrefillChunk(row, n, p + n, table))
        row += n
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots),
        block_size=BS,
        num_decodes=2,
        decode_block_tables=dec_tables,
        decode_context_lens=torch.tensor(decodes),
        prefills=prefills,
    )
    T = row
    q, k, v = (torch.randn(T, h, D, generator=gen) for h in (H, KVH, KVH))
    cache = torch.randn(2, KVH, num_slots, D, generator=gen)  # the cached prefixes: random
    return q, k, v, cache, meta


@pytest.mark.parametrize("backend", ["cpu", "triton"])
@pytest.mark.parametrize("window,softcap", [(5, 0.0), (0, 0.7), (6, 0.9), (64, 0.0)])
def test_backend_equals_the_torch_reference(backend, window, softcap):
    gen = torch.Generator().manual_seed(window + int(10 * softcap))
    q, k, v, cache, meta = _step(gen)
    ref_backend = make_backend("torch", H, KVH, D)
    want = ref_backend.forward(q, k, v, cache.clone(), meta, window=window, softcap=softcap)
    meta.packed_prefills = meta.decode_int32 = None
    got = forward(backend, H, KVH, D, q, k, v, cache.clone(), meta, window=window, softcap=softcap)
    assert (got - want).abs().max() < 1e-5
    # the switch bites: the same step without it differs
    meta.packed_prefills = meta.decode_int32 = None
    plain = ref_backend.forward(q, k, v, cache.clone(), meta)
    assert (plain - want).abs().max() > 1e-3 or window >= 64


def test_window_reference_is_the_last_keys_only():
    """The reference's decode with a window equals full attention over the last `window` keys."""
    gen = torch.Generator().manual_seed(3)
    q, k, v, cache, meta = _step(gen)
    backend = make_backend("torch", H, KVH, D)
    out = backend.forward(q, k, v, cache, meta, window=5)
    b, ctx = 0, 37
    table = meta.decode_block_tables[b]
    slots = (table[:, None] * BS + torch.arange(BS)).reshape(-1)[ctx - 5 : ctx]
    keys, values = cache[0][:, slots], cache[1][:, slots]  # [KVH, 5, D]
    qb = q[b].view(KVH, H // KVH, D)
    probs = torch.softmax(qb @ keys.transpose(1, 2) * D**-0.5, -1)
    assert torch.allclose(out[b], (probs @ values).reshape(H, D), atol=1e-5)
