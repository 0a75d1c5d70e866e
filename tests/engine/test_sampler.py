"""The sampler: a row without a seed takes the token where one uniform falls in its cumulative
distribution (no token loses its share, a forbidden one is never taken); a seeded row's
noise is hashed on the device from one key drawn from its host generator (no vocabulary-sized host
row); both with the right law, side by side in one batch; no step of it waits on the device."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from engine.request import SamplingParams
from engine.sampler import _exponential_of_bits, hashed_exponential, inverse_cdf, sample_ids

SYNCING = {"aten::nonzero", "aten::_local_scalar_dense", "aten::masked_select", "aten::item"}


def test_a_seeded_row_takes_one_key_from_its_generator():
    logits = torch.randn(2, 49152)
    gen, twin = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    sample_ids(logits, [SamplingParams(temperature=1.0)] * 2, [gen, None])
    torch.randint(0, 2**62, (1,), generator=twin)
    assert torch.equal(gen.get_state(), twin.get_state())


def test_seeded_draws_repeat_and_follow_the_distribution():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().repeat(4000, 1)
    params = [SamplingParams(temperature=1.0)] * 4000
    first = sample_ids(logits, params, [torch.Generator().manual_seed(i) for i in range(4000)])
    again = sample_ids(logits, params, [torch.Generator().manual_seed(i) for i in range(4000)])
    assert torch.equal(first, again)
    freq = torch.bincount(first, minlength=4).float() / 4000
    assert (freq - probs).abs().max() < 0.03, freq


def test_hashed_noise_is_exponential():
    e = hashed_exponential(torch.tensor([3, 2**61 + 5]), 100_000)
    assert e.shape == (2, 100_000) and torch.isfinite(e).all() and (e > 0).all()
    assert abs(e.mean().item() - 1.0) < 0.02 and abs(e.var().item() - 1.0) < 0.05
    assert not torch.equal(e[0], e[1])


def test_sampling_makes_no_op_that_waits_for_the_device():
    seen = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func._schema.name)
            return func(*args, **(kwargs or {}))

    params = [
        SamplingParams(temperature=0.7, top_k=5),
        SamplingParams(temperature=0),
        SamplingParams(temperature=1.0, top_p=0.9),
    ]
    with Record():
        sample_ids(torch.randn(3, 512), params, [torch.Generator().manual_seed(1), None, None])
    assert not SYNCING & set(seen), SYNCING & set(seen)


def test_every_hashed_draw_is_finite_and_positive_at_the_extremes():
    # the top 24-bit value once gave U = 1 in float32, a draw of 0, and p / 0 = NaN for a token a
    # grammar forbids (p = 0): argmax then chose that token
    draws = _exponential_of_bits(torch.tensor([0, 1, 2**23, 2**24 - 2, 2**24 - 1]))
    assert torch.isfinite(draws).all() and (draws > 0).all()
    probs = torch.tensor([[0.0, 1.0]])
    noise = _exponential_of_bits(torch.tensor([[2**24 - 1, 2**24 - 1]]))
    assert (probs / noise).argmax(dim=-1).item() == 1


def test_unseeded_draws_follow_the_distribution():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0])
    logits = probs.log().repeat(20000, 1)  # the last token: -inf, never taken
    drawn = sample_ids(logits, [SamplingParams(temperature=1.0)] * 20000, [None] * 20000)
    freq = torch.bincount(drawn, minlength=5).float() / 20000
    assert freq[4] == 0 and (freq - probs).abs().max() < 0.015, freq


def _pick(weights: torch.Tensor, u: float) -> int:
    return inverse_cdf(weights, torch.tensor([[u]], dtype=torch.float64)).item()


def _share(weights: torch.Tensor, token: int) -> float:
    """The length of the uniforms in [0, 1) that inverse_cdf maps to ``token`` (it is monotone)."""

    def first_reaching(t: int) -> float:
        lo, hi = 0.0, 1.0
        for _ in range(64):
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if _pick(weights, mid) >= t else (mid, hi)
        return hi

    return first_reaching(token + 1) - first_reaching(token)


def test_the_inverse_cdf_takes_the_token_a_uniform_falls_in_and_never_a_forbidden_one():
    weights = torch.tensor([[0.0, 0.5, 0.0, 0.3, 0.2, 0.0]])  # padded to a block of 256 zeros
    assert [_pick(weights, u) for u in (0.0, 0.4999, 0.5001, 0.7999, 0.8001)] == [1, 1, 3, 3, 4]
    assert _pick(weights, 1 - 2**-53) == 4  # u * total may round to total: still the last allowed token
    for vocab in (151936, 1001):  # blocks of 128; a padded last block
        row = torch.zeros(1, vocab)
        row[0, [5, 700, vocab - 3]] = torch.tensor([2.0, 1.0, 1.0])
        picks = {_pick(row, u / 64) for u in range(64)} | {_pick(row, 1 - 2**-53)}
        assert picks == {5, 700, vocab - 3}


def test_every_token_keeps_its_share_of_the_uniforms_down_to_1e_9():
    # a 1e-9 token right after a 0.5 one in the same block, another alone in its block: a float32
    # cumulative sum gives the first none of the uniforms (0.5 + 1e-9 rounds to 0.5)
    weights = torch.zeros(1, 49152)
    weights[0, [1000, 1001, 5000, 40000]] = torch.tensor([0.5, 1e-9, 1e-9, 0.25])
    total = weights.double().sum().item()
    for token in (1000, 1001, 5000, 40000):
        want = weights[0, token].item() / total
        assert abs(_share(weights, token) - want) <= 1e-6 * want, token


def test_greedy_seeded_and_unseeded_rows_side_by_side():
    torch.manual_seed(0)
    logits = torch.randn(3, 49152)
    params = [SamplingParams(temperature=0), SamplingParams(temperature=1.0), SamplingParams(temperature=1.0)]
    together = sample_ids(logits, params, [None, torch.Generator().manual_seed(5), None])
    alone = sample_ids(logits[1:2], params[1:2], [torch.Generator().manual_seed(5)])
    assert together[0] == logits[0].argmax() and together[1] == alone[0]
    forbidden = logits.clone()
    forbidden[2, forbidden[2].topk(49000).indices] = float("-inf")  # 152 tokens left in the last row
    allowed = set(torch.isfinite(forbidden[2]).nonzero().flatten().tolist())
    for _ in range(50):
        assert sample_ids(forbidden, params, [None, None, None])[2].item() in allowed
