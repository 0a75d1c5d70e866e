"""A running model of one engine step's cost, learned from measured step times.

    seconds = step_s + prefill_token_s * prefill_tokens + decode_seq_s * decode_seqs

fitted by least squares over the recent steps (each observation's weight decays by DECAY per
step, so the model follows load and thermal changes), with the configured prior held as three
fixed pseudo-observations so that a model with few or uniform observations stays well posed.
Plain Python: three unknowns, solved by Gaussian elimination when `theta` is read after new
observations (an observation only updates the decayed sums: the engine observes every step, and
most steps read nothing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.scheduler.plan import StepPlan

DECAY = 0.99  # per observation: the model remembers the last ~100 steps
PRIOR_WEIGHT = 0.02  # weight of each prior pseudo-observation
PRIOR_PREFILL, PRIOR_DECODES = 256, 8  # where the prior pseudo-observations sit


FLOOR = 0.01  # the smallest fitted term, as a share of its prior


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


class StepCostModel:
    def __init__(self, step_s: float = 0.005, prefill_token_s: float = 0.0002, decode_seq_s: float = 0.001):
        self.prior = (step_s, prefill_token_s, decode_seq_s)
        self._theta: list[float] | None = list(self.prior)  # None: observed since the last fit
        self._xtx = [[0.0] * 3 for _ in range(3)]
        self._xty = [0.0] * 3

    @property
    def theta(self) -> list[float]:
        """[step_s, prefill_token_s, decode_seq_s] fitted on the observations so far."""
        if self._theta is None:
            self._theta = self._fit()
        return self._theta

    def predict(self, prefill_tokens: int, decode_seqs: int) -> float:
        a, b, c = self.theta
        return a + b * prefill_tokens + c * decode_seqs

    def observe(self, prefill_tokens: int, decode_seqs: int, seconds: float) -> None:
        x = (1.0, float(prefill_tokens), float(decode_seqs))
        for i in range(3):
            self._xty[i] = self._xty[i] * DECAY + x[i] * seconds
            for j in range(3):
                self._xtx[i][j] = self._xtx[i][j] * DECAY + x[i] * x[j]
        self._theta = None

    def _fit(self) -> list[float]:
        a, b = [row[:] for row in self._xtx], self._xty[:]
        s, p, d = self.prior
        for x in ((1.0, 0.0, 0.0), (1.0, PRIOR_PREFILL, 0.0), (1.0, 0.0, PRIOR_DECODES)):
            y = s + p * x[1] + d * x[2]
            for i in range(3):
                b[i] += PRIOR_WEIGHT * x[i] * y
                for j in range(3):
                    a[i][j] += PRIOR_WEIGHT * x[i] * x[j]
        # a step never costs nothing: a fit that drives a term to or below zero (fast steps of
        # one kind only) keeps FLOOR of the prior's value for it
        return [max(FLOOR * prior, v) for v, prior in zip(_solve(a, b), self.prior)]
