"""Token selection for the rows that sample: greedy, temperature, top-k, top-p, per-request seeds.
Runs on the logits' device; only the chosen token ids come back to the host. The per-row values
(temperatures, k, p, seeded rows) go through pinned memory without waiting (engine/device.py)."""

from __future__ import annotations

import torch

from engine.device import host_to_device
from engine.models.fused import argmax_rows
from engine.request import SamplingParams

_M32 = 0xFFFFFFFF
_MIX = 0x45D9F3B  # a 32-bit integer hash's multiplier (< 2**27: products stay below 2**59)
_GOLDEN = 0x9E3779B1


def sample(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> list[int]:
    """logits: [S, V] fp32, one row per sampling sequence. Returns one token id per row."""
    return sample_ids(logits, params, generators).tolist()


def sample_ids(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> torch.Tensor:
    """As `sample`, the ids left on the logits' device: [S] int64."""
    greedy = [p.greedy for p in params]
    if all(greedy):
        return argmax_rows(logits)
    raw, device = logits, logits.device
    temps = torch.tensor([p.temperature if not p.greedy else 1.0 for p in params], dtype=logits.dtype)
    logits = logits / host_to_device(temps, device)[:, None]
    if any(p.top_k > 0 or p.top_p < 1 for p in params):
        logits = _top_k_top_p(logits, params)
    # A row without a seed draws one uniform and takes the token where it falls in the row's
    # cumulative distribution (inverse_cdf). A seeded row takes one 62-bit key a step from its own
    # host generator and hashes (key, token) into exponential noise on the device, argmax(p / E)
    # with E ~ Exp(1), with integer arithmetic that every device computes alike: a seed gives the
    # same tokens on any device, and no vocabulary-sized row is drawn on the host. Greedy rows take
    # the argmax of their logits below.
    S, vocab = logits.shape
    seeded = [i for i, (p, gen) in enumerate(zip(params, generators)) if gen is not None and not p.greedy]
    if seeded:
        keys = torch.cat([torch.randint(0, 2**62, (1,), generator=generators[i]) for i in seeded])
        rows = host_to_device(torch.tensor(seeded), device)
        noise = hashed_exponential(host_to_device(keys, device), vocab)
        seeded_ids = (torch.softmax(logits.index_select(0, rows), dim=-1) / noise).argmax(dim=-1)
    if len(seeded) < greedy.count(False):
        # exp(l - max l): the softmax's numerators, in place (``logits`` is this function's own
        # tensor by now); the normalization is the cumulative sum's last value
        weights = logits.sub_(logits.amax(dim=-1, keepdim=True)).exp_()
        sampled = inverse_cdf(weights, torch.rand((S, 1), dtype=torch.float64, device=device))
    else:
        sampled = torch.zeros(S, dtype=torch.int64, device=device)
    if seeded:
        sampled = sampled.index_copy(0, rows, seeded_ids)
    if not any(greedy):  # no argmax over rows that sample
        return sampled
    return torch.where(host_to_device(torch.tensor(greedy), device), argmax_rows(raw), sampled)


CDF_BLOCK = 256  # tokens a block of inverse_cdf's first level, at most


def inverse_cdf(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """The token of each row of ``weights`` [S, V] (fp32, >= 0, each row's sum > 0; a row's scale
    does not matter) where ``uniforms`` [S, 1] (float64, in [0, 1)) falls in the row's cumulative
    distribution, in two levels: blocks of up to CDF_BLOCK tokens by their sums (float32 sums, float64
    cumulative sums), then the token inside the chosen block by its float64 cumulative sum, the
    uniform's place in the block rescaled to the block's float64 total. Each token's share of the
    uniforms is its weight's share up to the float32 rounding of its block's sum (about 1e-7
    relative, the order of the fp32 softmax's own): a token of probability 1e-9 beside one of 0.5
    keeps its share, and a token of weight 0 is never taken (its cumulative sum equals its
    predecessor's). No float64 copy of the batch is made: sample_ids over 64 rows of 49,152 takes
    5.8 ms with it against 35.8 ms with an exponential draw per token, one CPU thread
    (benchmarks/sampling.py).
    """
    S, vocab = weights.shape
    # the largest power of two up to CDF_BLOCK that divides the vocabulary (151,936 = 1,187 x 128),
    # else CDF_BLOCK and the row padded with zeros (never taken): a copy of the whole batch
    size = next((b for b in (CDF_BLOCK, CDF_BLOCK // 2, CDF_BLOCK // 4) if vocab % b == 0), CDF_BLOCK)
    nb = -(-vocab // size)
    if vocab != nb * size:
        weights = torch.nn.functional.pad(weights, (0, nb * size - vocab))
    blocks = weights.view(S, nb, size)
    sums = blocks.sum(dim=-1).to(torch.float64)  # [S, nb]
    cdf = sums.cumsum(dim=-1)
    x = uniforms * cdf[:, -1:]
    j = _below_search(cdf, x)  # [S, 1]: the block
    before = torch.where(j > 0, cdf.gather(1, (j - 1).clamp_(min=0)), 0.0)
    share = (x - before) / sums.gather(1, j)  # the uniform's place in its block, in [0, 1)
    inner = blocks.gather(1, j[:, :, None].expand(S, 1, size)).view(S, size)
    inner = inner.to(torch.float64).cumsum_(dim=-1)
    k = _below_search(inner, share * inner[:, -1:])
    return (j * size + k).squeeze_(1).clamp_(max=vocab - 1)


def _below_search(cdf: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Per row, the first index whose ``cdf`` exceeds ``x`` [S, 1], with x kept below the row's
    total (x may round up to it: the largest double below the total still falls at or after the
    last positive entry's predecessor)."""
    total = cdf[:, -1:]
    x = torch.minimum(x, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, x, right=True).clamp_(max=cdf.shape[-1] - 1)


def hashed_exponential(keys: torch.Tensor, vocab: int) -> torch.Tensor:
    """Exp(1) draws [K, vocab] from 62-bit keys [K] int64: token t of row r is a 32-bit integer hash
    of (key, t), its top 24 bits a uniform U in (0, 1), the draw -log(U). Integer ops only up to U,
    so the draws are the same on every device (log itself may differ in the last bit)."""
    idx = torch.arange(vocab, device=keys.device, dtype=torch.int64)
    lo, hi = (keys & _M32)[:, None], ((keys >> 32) & _M32)[:, None]
    x = _hash32(((idx * _GOLDEN) & _M32)[None, :] ^ lo)
    x = _hash32(x ^ hi)
    return _exponential_of_bits(x >> 8)


def _exponential_of_bits(bits: torch.Tensor) -> torch.Tensor:
    """-log(U) for U = (bits + 0.5) / 2**24, bits in [0, 2**24): U is strictly inside (0, 1), so every
    draw is finite and above 0. In float64: in float32 the top value 2**24 - 0.5 rounds to 2**24,
    U to 1 and the draw to 0, which turns a forbidden token's 0 / 0 into NaN and argmax's choice."""
    u = (bits.to(torch.float64) + 0.5) * (1.0 / 2**24)
    return u.log_().neg_().to(torch.float32)


def _hash32(x: torch.Tensor) -> torch.Tensor:
    x = (((x >> 16) ^ x) * _MIX) & _M32
    x = (((x >> 16) ^ x) * _MIX) & _M32
    return (x >> 16) ^ x


def _top_k_top_p(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    device = logits.device
    ks = host_to_device(torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params]), device)
    ps = host_to_device(torch.tensor([p.top_p for p in params], dtype=logits.dtype), device)
    ranks = torch.arange(vocab, device=device)[None, :]
    drop = ranks >= ks[:, None]
    probs = torch.softmax(sorted_logits, dim=-1)
    before = probs.cumsum(dim=-1) - probs  # mass strictly before each token; the top token always stays
    drop |= before > ps[:, None]
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)
