"""Attention sinks (gpt-oss) in every attention backend against transformers' formula: each head's
sink logit is one more column of its softmax (`cat([scores, sink])`, max subtracted, softmax, the
sink's column dropped), so it takes probability from the keys and gives no value. Mixed steps of
decodes and chunked prefills (a fresh chunk, a chunk over a cached prefix), GQA, windows that bite,
fp32 and bf16; Triton in the interpreter (tests/engine/conftest.py)."""

from __future__ import annotations

import pytest
import torch
from triton_device import forward

from engine.attention import AttentionMetadata, PrefillChunk, make_backend

H, KVH, D, BS = 8, 2, 16, 8
DECODES = [37, 12, 3]  # context lengths, the new token included
CHUNKS = [(0, 19), (21, 9)]  # (cached prefix, new tokens): a prompt's first chunk, and a later one


def _step(gen: torch.Generator, dtype: torch.dtype, decodes_only: bool = False):
    """One packed step over shuffled blocks of a shared cache, its cached prefixes random. The cpu
    backend runs its C kernel on decode-only steps (`decodes_only`: the step without its chunks)."""
    lens = DECODES + [p + n for p, n in CHUNKS]
    blocks = torch.randperm(sum(-(-n // BS) for n in lens) + 2, generator=gen)
    tables, used = [], 0
    for n in lens:
        nb = -(-n // BS)
        tables.append(blocks[used : used + nb])
        used += nb
    nd = len(DECODES)
    width = max(len(t) for t in tables[:nd])
    dec_tables = torch.stack([torch.cat([t, t.new_zeros(width - len(t))]) for t in tables[:nd]])
    slots = [int(tables[i][(n - 1) // BS]) * BS + (n - 1) % BS for i, n in enumerate(DECODES)]
    prefills, row, positions = [], nd, [n - 1 for n in DECODES]
    for (p, n), table in zip(CHUNKS, tables[nd:]):
        slots += (table[:, None] * BS + torch.arange(BS)).reshape(-1)[p : p + n].tolist()
        prefills.append(PrefillChunk(row, n, p + n, table))
        positions += range(p, p + n)
        row += n
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots),
        block_size=BS,
        num_decodes=nd,
        decode_block_tables=dec_tables,
        decode_context_lens=torch.tensor(DECODES),
        prefills=prefills,
    )
    q, k, v = (torch.randn(row, h, D, generator=gen).to(dtype) for h in (H, KVH, KVH))
    cache = torch.randn(2, KVH, len(blocks) * BS, D, generator=gen).to(dtype)
    if decodes_only:
        meta.prefills, meta.slot_mapping = [], meta.slot_mapping[:nd]
        q, k, v, positions = q[:nd], k[:nd], v[:nd], positions[:nd]
    return q, k, v, cache, meta, tables, positions


def transformers_reference(q, k, v, cache, meta, tables, positions, window, sinks) -> torch.Tensor:
    """[T, H, D] float64: per query row, modeling_gpt_oss.eager_attention_forward over its visible keys."""
    cache = cache.clone().double()
    cache[0][:, meta.slot_mapping] = k.double().transpose(0, 1)
    cache[1][:, meta.slot_mapping] = v.double().transpose(0, 1)
    seq_of_row = [i for i in range(len(DECODES))]
    for j, chunk in enumerate(meta.prefills):
        seq_of_row += [len(DECODES) + j] * chunk.num_tokens
    assert len(seq_of_row) == q.shape[0]
    out = torch.empty(q.shape, dtype=torch.float64)
    for r, (s, pos) in enumerate(zip(seq_of_row, positions)):
        keys = torch.arange(pos + 1)
        if window:
            keys = keys[keys > pos - window]
        slot = tables[s][keys // BS] * BS + keys % BS
        kr = cache[0][:, slot].repeat_interleave(H // KVH, 0)  # [H, n, D] (repeat_kv)
        vr = cache[1][:, slot].repeat_interleave(H // KVH, 0)
        scores = torch.einsum("hd,hnd->hn", q[r].double(), kr) * D**-0.5
        combined = torch.cat([scores, sinks.double()[:, None]], dim=-1)
        combined = combined - combined.max(dim=-1, keepdim=True).values
        probs = torch.softmax(combined, dim=-1)[:, :-1]  # the sink's column dropped
        out[r] = torch.einsum("hn,hnd->hd", probs, vr)
    return out


def _sinks(gen: torch.Generator) -> torch.Tensor:
    """Per-head logits from well below the scores to well above them (most of a row's mass)."""
    return (torch.randn(H, generator=gen) * 2 + torch.linspace(-4, 6, H)).float()


# a step with prefill chunks runs the cpu backend's torch path; a decode-only step its C kernel
@pytest.mark.parametrize(
    "backend,decodes_only", [("torch", False), ("cpu", False), ("cpu", True), ("triton", False)]
)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-6), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("window", [0, 5])
def test_backend_equals_transformers_formula(backend, decodes_only, dtype, tol, window):
    gen = torch.Generator().manual_seed(window + 7)
    q, k, v, cache, meta, tables, positions = _step(gen, dtype, decodes_only)
    sinks = _sinks(gen)
    want = transformers_reference(q, k, v, cache, meta, tables, positions, window, sinks)
    got = forward(backend, H, KVH, D, q, k, v, cache.clone(), meta, window=window, sinks=sinks)
    assert got.dtype == dtype
    assert (got.double() - want).abs().max() < tol
    # the sinks bite: without them every row differs
    meta.packed_prefills = meta.decode_int32 = None
    plain = make_backend("torch", H, KVH, D).forward(q, k, v, cache.clone(), meta, window=window)
    assert ((plain.double() - want).abs().amax(dim=(1, 2)) > 1e-2).all()


def test_the_window_bites_with_sinks():
    gen = torch.Generator().manual_seed(1)
    q, k, v, cache, meta, tables, positions = _step(gen, torch.float32)
    sinks = _sinks(gen)
    full = transformers_reference(q, k, v, cache, meta, tables, positions, 0, sinks)
    slid = transformers_reference(q, k, v, cache, meta, tables, positions, 5, sinks)
    late = torch.tensor(positions) >= 5  # rows with keys out of the window
    assert ((full - slid).abs().amax(dim=(1, 2)) > 1e-3)[late].all()


def test_a_huge_sink_takes_every_row_and_a_tiny_one_none():
    """sink -> +inf: the outputs go to 0 (no value); sink -> -inf: plain softmax attention."""
    gen = torch.Generator().manual_seed(2)
    for backend, decodes_only in [("torch", False), ("cpu", False), ("cpu", True), ("triton", False)]:
        q, k, v, cache, meta, *_ = _step(gen, torch.float32, decodes_only)
        meta.packed_prefills = meta.decode_int32 = None
        high = forward(backend, H, KVH, D, q, k, v, cache.clone(), meta, sinks=torch.full((H,), 60.0))
        assert high.abs().max() < 1e-15
        meta.packed_prefills = meta.decode_int32 = None
        low = forward(backend, H, KVH, D, q, k, v, cache.clone(), meta, sinks=torch.full((H,), -60.0))
        meta.packed_prefills = meta.decode_int32 = None
        plain = forward(backend, H, KVH, D, q, k, v, cache.clone(), meta)
        assert (low - plain).abs().max() < 1e-6, backend


def test_cpu_backend_refuses_sinks_of_the_wrong_shape():
    gen = torch.Generator().manual_seed(3)
    q, k, v, cache, meta, *_ = _step(gen, torch.float32, decodes_only=True)
    with pytest.raises(ValueError, match="sinks must be"):
        make_backend("cpu", H, KVH, D).forward(q, k, v, cache, meta, sinks=torch.zeros(KVH))
