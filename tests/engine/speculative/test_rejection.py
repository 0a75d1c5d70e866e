"""Rejection sampling of a prompt-lookup draft is distribution-preserving: the first token kept is
distributed as the target's p whatever the draft (chi-square, 20k draws for a likely draft and 4k
for the others, significance 0.001)."""

import torch

from engine.request import SamplingParams, Sequence
from engine.scheduler import ScheduledSeq
from engine.speculative.verify import _rejection_sample

DRAWS = 20_000  # for the likely draft
ALPHA = 1e-3  # a correct sampler fails one run in a thousand


def _p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's chi-square against `probs` over the bins expecting >= 5 draws (the rest pooled)."""
    expected = probs * counts.sum()
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    stat = (((obs - exp) ** 2)[keep] / exp[keep]).sum()
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64), stat / 2))


def _first_tokens(
    logits: torch.Tensor, draft: list[int], params: SamplingParams, draws: int = 4_000
) -> torch.Tensor:
    seq = Sequence("r", [0, 1, 2], 3, params)
    item = ScheduledSeq(seq, 1, draft=draft)
    gen = torch.Generator().manual_seed(1234)
    counts = torch.zeros(logits.shape[1], dtype=torch.float64)
    for _ in range(draws):
        counts[_rejection_sample(logits, item, gen)[0]] += 1
    return counts


def _target(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    from engine.sampler import _top_k_top_p

    scaled = logits[:1] / params.temperature
    if params.top_k > 0 or params.top_p < 1:
        scaled = _top_k_top_p(scaled, [params])
    return torch.softmax(scaled, dim=-1)[0].double()


def test_first_token_follows_the_target_distribution():
    torch.manual_seed(0)
    logits = torch.randn(3, 40) * 1.5  # rows for the token after the decode and after each draft
    for params, draft, draws in [
        (SamplingParams(temperature=1.0, max_tokens=8), [int(logits[0].argmax()), 5], DRAWS),  # likely
        (SamplingParams(temperature=0.7, max_tokens=8), [int(logits[0].argmin()), 5], 4_000),  # unlikely
        (SamplingParams(temperature=1.0, top_k=10, top_p=0.9, max_tokens=8), [3, 7], 4_000),
    ]:
        target = _target(logits, params)
        counts = _first_tokens(logits, draft, params, draws)
        assert counts[target == 0].sum() == 0  # nothing outside top-k / top-p
        assert _p_value(counts, target) > ALPHA, (params, draft)


def test_a_draft_the_target_rules_out_is_never_kept():
    logits = torch.zeros(2, 10)
    logits[0, 4] = float("-inf")
    params = SamplingParams(temperature=1.0, max_tokens=8)
    counts = _first_tokens(logits, [4], params, 2_000)
    assert counts[4] == 0 and counts.sum() == 2_000
