"""The sampler: a seeded row's noise is hashed on the device from one key drawn from its host
generator (no vocabulary-sized host row), with the right law; no step of it waits on the device."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from engine.request import SamplingParams
from engine.sampler import _exponential_of_bits, hashed_exponential, sample_ids

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
