"""The triton backend computes what the torch reference does for a mixed step (decodes, fresh
prefills, extends over a cached prefix) and leaves the same cache; "auto" picks it only on CUDA."""

import pytest
import torch

from engine.attention import AttentionMetadata, PrefillChunk, make_backend

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def mixed_step(heads, kvh, d, bs, dtype, seed):
    """A cache with some history and one packed step: 3 decodes, then a fresh prefill and an extend."""
    gen = torch.Generator().manual_seed(seed)
    num_blocks = 40
    cache = torch.randn(2, kvh, num_blocks * bs, d, generator=gen).to(dtype)
    blocks = torch.randperm(num_blocks, generator=gen).tolist()
    decode_ctx = [1, bs + 3, 5 * bs]  # the new token included
    prefills = [(0, 2 * bs + 5), (3 * bs - 1, 9)]  # (cached prefix, new tokens)
    tables, used = [], 0
    for n in decode_ctx + [p + n for p, n in prefills]:
        nb = -(-n // bs)
        tables.append(blocks[used : used + nb])
        used += nb
    slots = [tables[i][(n - 1) // bs] * bs + (n - 1) % bs for i, n in enumerate(decode_ctx)]
    chunks, row = [], len(decode_ctx)
    for j, (p, n) in enumerate(prefills):
        t = torch.tensor(tables[len(decode_ctx) + j])
        slots += (t[:, None] * bs + torch.arange(bs)).view(-1)[p : p + n].tolist()
        chunks.append(PrefillChunk(row, n, p + n, t.to(DEVICE)))
        row += n
    width = max(len(t) for t in tables[: len(decode_ctx)])
    dec_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables[: len(decode_ctx)]])
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots).to(DEVICE),
        block_size=bs,
        num_decodes=len(decode_ctx),
        decode_block_tables=dec_tables.to(DEVICE),
        decode_context_lens=torch.tensor(decode_ctx).to(DEVICE),
        prefills=chunks,
    )
    T = row
    q, k, v = (torch.randn(T, h, d, generator=gen).to(dtype).to(DEVICE) for h in (heads, kvh, kvh))
    return q, k, v, cache.to(DEVICE), meta


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 2e-3)])
@pytest.mark.parametrize("heads,kvh,bs", [(4, 2, 16), (8, 1, 32), (6, 6, 16)])
def test_mixed_step_matches_the_torch_reference(dtype, tol, heads, kvh, bs):
    q, k, v, cache, meta = mixed_step(heads, kvh, 64, bs, dtype, seed=heads * bs)
    ref_cache = cache.clone()
    ref = make_backend("torch", heads, kvh, 64).forward(q, k, v, ref_cache, meta).float()
    out = make_backend("triton", heads, kvh, 64, DEVICE).forward(q, k, v, cache, meta).float()
    assert ((out - ref).norm() / ref.norm()).item() < tol
    assert torch.equal(cache, ref_cache)


def test_auto_picks_triton_on_cuda_only():
    assert type(make_backend("auto", 4, 2, 64, "cpu")).__name__ in ("CPUPagedAttention", "TorchAttention")
    if torch.cuda.is_available():
        assert type(make_backend("auto", 4, 2, 64, "cuda")).__name__ == "TritonAttention"


def test_triton_refuses_what_its_kernels_cannot_do():
    with pytest.raises(ValueError, match="head_dim"):
        make_backend("triton", 4, 2, 48, DEVICE)
