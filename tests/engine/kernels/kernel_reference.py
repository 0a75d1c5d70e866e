"""Random paged caches and the attention they should give, computed in float64 with plain torch."""

from __future__ import annotations

import math

import torch

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def random_paged_kv(
    lens: list[int], kvh: int, d: int, block_size: int, dtype, gen: torch.Generator, spare_blocks: int = 3
):
    """A cache [2, KVH, slots, D] holding one sequence per entry of `lens` in shuffled blocks, its
    block tables [S, max_blocks] (padded with block 0) and each sequence's K/V [2, KVH, L, D]."""
    per_seq = [max(1, -(-n // block_size)) for n in lens]
    num_blocks = sum(per_seq) + spare_blocks
    order = torch.randperm(num_blocks, generator=gen)
    cache = torch.randn(2, kvh, num_blocks * block_size, d, generator=gen).to(dtype)
    tables, seqs, used = [], [], 0
    for n, nb in zip(lens, per_seq):
        blocks = order[used : used + nb]
        used += nb
        slots = (blocks[:, None] * block_size + torch.arange(block_size)).reshape(-1)[:n]
        seqs.append(cache[:, :, slots])
        tables.append(blocks)
    width = max(per_seq)
    table = torch.zeros(len(lens), width, dtype=torch.int64)
    for i, t in enumerate(tables):
        table[i, : len(t)] = t
    return cache, table, seqs


def attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    num_prefix: int,
    window: int = 0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """q: [n, H, D] at positions num_prefix .. num_prefix + n - 1; k, v: [KVH, L, D] with
    L = num_prefix + n. Causal GQA attention in float64: [n, H, D]. window > 0: each query sees its
    last `window` keys; sinks [H]: gpt-oss's sink logits, one more softmax column with no value."""
    n, H, D = q.shape
    kvh, L, _ = k.shape
    g = H // kvh
    qf = q.double().view(n, kvh, g, D)
    s = torch.einsum("nkgd,kld->nkgl", qf, k.double()) / math.sqrt(D)
    pos = torch.arange(L, device=k.device)
    qpos = (num_prefix + pos[:n])[:, None]
    visible = pos[None, :] <= qpos  # [n, L]
    if window:
        visible &= pos[None, :] > qpos - window
    s = s.masked_fill(~visible[:, None, None, :], float("-inf"))
    if sinks is not None:
        sink = sinks.double().to(s.device).view(1, kvh, g, 1).expand(n, kvh, g, 1)
        p = torch.cat([s, sink], dim=-1).softmax(-1)[..., :-1]
    else:
        p = s.softmax(-1)
    o = torch.einsum("nkgl,kld->nkgd", p, v.double())
    return o.reshape(n, H, D)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm()).item()
