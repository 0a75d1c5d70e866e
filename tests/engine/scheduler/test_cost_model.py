"""The step-cost model (engine/scheduler/cost_model.py) after a spell of steps of one shape: what
earlier steps of other shapes taught about the split between a step's fixed and per-token cost is
kept, and with no such steps the prior's split is kept at the measured level. The truth is a known
synthetic cost function."""

import random

import pytest

from engine.scheduler.cost_model import StepCostModel


def cpu(prefill: int, decodes: int) -> float:
    """A CPU-like step: 10 ms + 0.6 ms per prefill token or decoding sequence."""
    return 0.010 + 0.0006 * (prefill + decodes)


def varied(m: StepCostModel) -> None:
    """Steps of many shapes: prompts alone, decodes alone, both."""
    for n in range(4, 129, 8):
        m.observe(n, 0, cpu(n, 0))
        m.observe(0, n // 4, cpu(0, n // 4))
        m.observe(n // 2, n // 8, cpu(n // 2, n // 8))


@pytest.mark.parametrize("full", [(128, 0), (96, 32)])
def test_a_spell_of_full_steps_keeps_what_varied_steps_taught(full):
    m = StepCostModel()  # the default prior: 5 ms + 0.2 ms a token + 1 ms a decode
    varied(m)
    for _ in range(1000):  # ten times the model's memory, every step the full budget
        m.observe(*full, cpu(*full))
    assert m.predict(*full) == pytest.approx(cpu(*full), rel=0.01)
    for shape in ((32, 0), (0, 8), (20, 4)):  # short steps: mostly fixed cost
        assert m.predict(*shape) == pytest.approx(cpu(*shape), rel=0.1), shape
    assert m.theta[0] == pytest.approx(0.010, rel=0.1)


def test_with_full_steps_only_the_prior_split_holds_at_the_measured_level():
    m = StepCostModel(0.005, 0.0003, 0.0003)  # the right shape, half the level
    for _ in range(300):
        m.observe(128, 0, cpu(128, 0))
    assert m.predict(128, 0) == pytest.approx(cpu(128, 0), rel=0.01)
    assert m.predict(32, 0) == pytest.approx(cpu(32, 0), rel=0.1)  # not mostly a "fixed" cost
    assert m.theta[0] == pytest.approx(0.010, rel=0.1)


def test_no_observation_is_the_prior_and_a_new_level_is_followed():
    assert StepCostModel(0.004, 0.0002, 0.001).theta == pytest.approx([0.004, 0.0002, 0.001])
    m = StepCostModel()
    varied(m)
    rng = random.Random(0)
    for _ in range(300):  # the machine slows down twofold; steps of every shape
        shape = rng.randrange(129), rng.randrange(33)
        m.observe(*shape, 2 * cpu(*shape))
    for shape in ((128, 0), (0, 32), (64, 16), (16, 0)):
        assert m.predict(*shape) == pytest.approx(2 * cpu(*shape), rel=0.05), shape


def mixed(m: StepCostModel, rng: random.Random, n: int, level: float = 1.0) -> None:
    """n steps as under a saturating backlog: full budgets, sometimes decodes alone."""
    for _ in range(n):
        p = rng.randrange(100)
        shape = (0, rng.randrange(20, 33)) if rng.random() < 0.2 else (p, 128 - p)
        m.observe(*shape, level * cpu(*shape))


def test_a_one_off_stall_does_not_hold_the_fit():
    m = StepCostModel()
    m.observe(64, 0, 1.0)  # a first forward with its one-time costs: 1 s for a ~50 ms step
    mixed(m, random.Random(0), 100)
    assert m.predict(32, 0) == pytest.approx(cpu(32, 0), rel=0.1)
    assert m.theta[0] == pytest.approx(0.010, rel=0.15)


def test_a_lasting_slowdown_is_followed():
    m = StepCostModel()
    rng = random.Random(0)
    mixed(m, rng, 100)
    mixed(m, rng, 300, level=10.0)  # ten times slower from now on: about what the fit remembers
    for shape in ((128, 0), (0, 32), (32, 0)):
        assert m.predict(*shape) == pytest.approx(10 * cpu(*shape), rel=0.1), shape
