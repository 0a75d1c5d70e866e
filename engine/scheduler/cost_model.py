"""A running model of one engine step's cost, learned from measured step times.

    seconds = step_s + prefill_token_s * prefill_tokens + decode_seq_s * decode_seqs

fitted by least squares on two timescales. The level comes from the recent steps (each
observation's weight decays by DECAY per step, so the model follows load and thermal changes);
where those steps cannot tell one term from another (a spell of steps of one shape: every step a
full token budget, so a step's fixed cost and its per-token cost move together) the split between
the terms comes from a slower fit over the last ~1000 steps (SLOW_DECAY), which keeps what steps of
other shapes measured. Each fit holds the split it starts from (the slow fit: the configured prior;
the recent fit: the slow fit's) as three pseudo-observations of one free scale, a shape rather than
a level, so a model with few or uniform observations stays well posed at the level it measured.
A step counts for at most OUTLIER times its predicted cost, so a one-off stall does not hold the fit.
Plain Python: four unknowns, solved by Gaussian elimination when `theta` is read after new
observations (an observation only updates the decayed sums: the engine observes every step, and
most steps read nothing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.scheduler.plan import StepPlan

DECAY = 0.99  # per observation: the recent fit remembers the last ~100 steps
SLOW_DECAY = 0.999  # and the slow fit, which gives the split between the terms, ~1000
PRIOR_WEIGHT = 0.02  # weight of each prior pseudo-observation
PRIOR_PREFILL, PRIOR_DECODES = 256, 8  # where the prior pseudo-observations sit
SCALE_WEIGHT = 1e-6  # of the prior's scale held near 1: the steps measured set the level


FLOOR = 0.01  # the smallest fitted term, as a share of its prior
OUTLIER = 4.0  # the most an observed step counts for, as a multiple of its predicted cost


def split(plan: StepPlan) -> tuple[int, int]:
    """(prefill tokens, decoding sequences) of a StepPlan (ScheduledSeq.is_decode).

    Call before finish_step.
    """
    prefill = decodes = 0
    for item in plan.scheduled:
        if item.is_decode:
            decodes += 1
        else:
            prefill += item.num_query_tokens  # a speculating decode: its token and its drafts
    return prefill, decodes


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    n = len(b)
    m = [row[:] + [v] for row, v in zip(a, b)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[piv] = m[piv], m[col]
        if abs(m[col][col]) < 1e-18:
            return [0.0] * n
        for r in range(n):
            if r != col:
                factor = m[r][col] / m[col][col]
                m[r] = [x - factor * y for x, y in zip(m[r], m[col])]
    return [m[i][n] / m[i][i] for i in range(n)]


class _Sums:
    """Decayed least-squares sums of observations x = (1, prefill tokens, decoding sequences)."""

    def __init__(self, decay: float):
        self.decay = decay
        self.xtx = [[0.0] * 3 for _ in range(3)]
        self.xty = [0.0] * 3

    def add(self, x: tuple[float, float, float], seconds: float) -> None:
        for i in range(3):
            self.xty[i] = self.xty[i] * self.decay + x[i] * seconds
            for j in range(3):
                self.xtx[i][j] = self.xtx[i][j] * self.decay + x[i] * x[j]

    def fit(self, shape: tuple[float, float, float]) -> list[float]:
        """The three terms, with `shape` held as a split of one free scale k: a pseudo-observation
        per term asks it to be k times its value in `shape` (k itself held near 1, far more weakly).
        With observations of one shape only the fit keeps `shape`'s split at the measured level,
        rather than shifting the measured cost onto one term."""
        n = 4  # step_s, prefill_token_s, decode_seq_s, k
        a = [row[:] + [0.0] for row in self.xtx] + [[0.0] * n]
        b = self.xty[:] + [0.0]
        at = (1.0, PRIOR_PREFILL, PRIOR_DECODES)  # each term's pseudo-observation
        for i, v in enumerate(shape):  # at[i] * (theta_i - k * v) = 0
            row = [0.0] * n
            row[i], row[3] = at[i], -at[i] * v
            for r in range(n):
                for c in range(n):
                    a[r][c] += PRIOR_WEIGHT * row[r] * row[c]
        level = sum(x * v for x, v in zip(at, shape))
        anchor = SCALE_WEIGHT * level * level  # level * (k - 1) = 0
        a[3][3] += anchor
        b[3] += anchor
        return _solve(a, b)[:3]


class StepCostModel:
    def __init__(self, step_s: float = 0.005, prefill_token_s: float = 0.0002, decode_seq_s: float = 0.001):
        self.prior = (step_s, prefill_token_s, decode_seq_s)
        self._theta: list[float] | None = list(self.prior)  # None: observed since the last fit
        self._last = list(self.prior)  # the last fit
        self._recent, self._slow = _Sums(DECAY), _Sums(SLOW_DECAY)

    @property
    def theta(self) -> list[float]:
        """[step_s, prefill_token_s, decode_seq_s] fitted on the observations so far."""
        if self._theta is None:
            self._theta = self._last = self._fit()
        return self._theta

    def predict(self, prefill_tokens: int, decode_seqs: int) -> float:
        a, b, c = self.theta
        return a + b * prefill_tokens + c * decode_seqs

    def observe(self, prefill_tokens: int, decode_seqs: int, seconds: float) -> None:
        """One measured step. A step slower than OUTLIER times the model's prediction counts as that
        many times the prediction: a one-off stall (an engine's first forward with its one-time
        costs, a descheduled process) would otherwise hold the fit for hundreds of steps, while a
        lasting slowdown still lifts the level by up to OUTLIER a step."""
        a, b, c = self._last
        if seconds > OUTLIER * (a + b * prefill_tokens + c * decode_seqs):
            seconds = min(seconds, OUTLIER * self.predict(prefill_tokens, decode_seqs))
        x = (1.0, float(prefill_tokens), float(decode_seqs))
        self._recent.add(x, seconds)
        self._slow.add(x, seconds)
        self._theta = None

    def _fit(self) -> list[float]:
        # a step never costs nothing: a fit that drives a term to or below zero (fast steps of
        # one kind only) keeps FLOOR of the prior's value for it
        floor = [FLOOR * prior for prior in self.prior]
        slow = self._slow.fit(self.prior)
        shape = (max(floor[0], slow[0]), max(floor[1], slow[1]), max(floor[2], slow[2]))
        return [max(f, v) for v, f in zip(self._recent.fit(shape), floor)]
