"""Token selection for the rows that sample: greedy, temperature, top-k, top-p, per-request seeds.
Runs on the logits' device; only the chosen token ids come back to the host."""

from __future__ import annotations

import torch

from engine.request import SamplingParams


def sample(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> list[int]:
    """logits: [S, V] fp32, one row per sampling sequence. Returns one token id per row."""
    return sample_ids(logits, params, generators).tolist()


def sample_ids(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> torch.Tensor:
    """As `sample`, the ids left on the logits' device: [S] int64."""
    greedy_ids = logits.argmax(dim=-1)
    if all(p.greedy for p in params):
        return greedy_ids
    device = logits.device
    temps = torch.tensor([p.temperature if not p.greedy else 1.0 for p in params], dtype=logits.dtype).to(
        device
    )
    logits = logits / temps[:, None]
    if any(p.top_k > 0 or p.top_p < 1 for p in params):
        logits = _top_k_top_p(logits, params)
    probs = torch.softmax(logits, dim=-1)
    # Gumbel-style draw: argmax(p / E) with E ~ Exp(1) samples from p; a seeded row uses its own
    # stream, a host generator: drawn on the host, so a seed gives the same tokens on any device.
    # Greedy rows draw nothing (their noise stays 1; they take greedy_ids below).
    vocab = probs.shape[1]
    noise = torch.ones_like(probs)
    free = [i for i, (p, gen) in enumerate(zip(params, generators)) if gen is None and not p.greedy]
    if free:
        noise[free] = _exponential((len(free), vocab), None, device)
    for i, gen in enumerate(generators):
        if gen is not None and not params[i].greedy:
            noise[i] = _exponential((vocab,), gen, torch.device("cpu")).to(device)
    sampled = (probs / noise).argmax(dim=-1)
    greedy_rows = torch.tensor([p.greedy for p in params]).to(device)
    return torch.where(greedy_rows, greedy_ids, sampled)


def _exponential(
    shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device
) -> torch.Tensor:
    """Exp(1) draws as -log(U), U uniform on (0, 1): the same law as Tensor.exponential_, and on the
    CPU about six times faster (0.14 ms against 0.8 ms for a 49,152-token row). U is kept above 0,
    so every draw is finite."""
    u = torch.rand(shape, generator=generator, device=device)
    return u.clamp_(min=torch.finfo(u.dtype).tiny).log_().neg_()


def _top_k_top_p(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    device = logits.device
    ks = torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params]).to(device)
    ps = torch.tensor([p.top_p for p in params], dtype=logits.dtype).to(device)
    ranks = torch.arange(vocab, device=device)[None, :]
    drop = ranks >= ks[:, None]
    probs = torch.softmax(sorted_logits, dim=-1)
    before = probs.cumsum(dim=-1) - probs  # mass strictly before each token; the top token always stays
    drop |= before > ps[:, None]
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)
