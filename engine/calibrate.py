"""Step costs measured before serving: a few steps of synthetic work, so that the engine's step-cost
models (an SLO policy's, and the one preemption and the short steps beside urgent work read) start
from this machine's times instead of the configured prior (``cost_step_s``, ``cost_prefill_token_s``,
``cost_decode_seq_s``: a CPU-sized guess, 10-100x off on a GPU or for a model of another size).

Without it, an SLO-aware engine on a machine much faster than the prior predicts TTFTs it would
easily meet as unattainable, and refuses them (here and at the gateway's door, which reads the
worker's fitted model) until steps of other work correct the fit; where every request carries a
tight target, none is admitted and the fit never moves.

Two rounds of the same work: the first only warms the kernels (its steps are not observed: a first
forward of a shape pays for allocations and kernel selection), the second is observed. Each round
is one long prompt decoding alone, then several short ones decoding together: prefills of two
sizes and decodes of one sequence and of several, so that the fit can tell its three terms apart.
Greedy, with random token ids of a fixed seed, as tenant ``CALIBRATION_TENANT``; the engine's
counters are reset afterwards, and nothing of it stays but the fits (and prefix-cache blocks no
real prompt matches, freed as any cached block is).
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from engine.request import SamplingParams
from engine.stats import EngineStats

if TYPE_CHECKING:
    from engine.engine import Engine

CALIBRATION_TENANT = "fairlane-calibration"
LONG_PROMPT = 128  # tokens of the first prefill (fewer where the context or the step budget is smaller)
SHORT_PROMPTS, SHORT_PROMPT = 8, 4  # the sequences that then decode together, and their prompts
DECODE_STEPS = 2  # of each request after its prefill


def calibrate(engine: Engine) -> int:
    """Run the calibration rounds on an idle ``engine``; returns the steps observed."""
    if engine.has_unfinished():
        raise RuntimeError("calibrate an idle engine (requests are in flight)")
    scheduler = engine.scheduler
    scheduler.observing = False
    try:
        _round(engine, 0)
    finally:
        scheduler.observing = True
    observed = _round(engine, 1)
    engine.stats = EngineStats()
    scheduler.num_admissions = 0  # the stats copy it at each step (random ids make no prefix hits)
    return observed


def _round(engine: Engine, round_: int) -> int:
    config = engine.config
    rng = random.Random(round_)
    vocab = engine.vocab_size
    budget = min(engine.max_model_len - DECODE_STEPS - 1, config.max_num_batched_tokens)
    long_prompt = max(1, min(LONG_PROMPT, budget))
    short = max(1, min(SHORT_PROMPTS, config.max_num_seqs))
    batches = [[long_prompt], [SHORT_PROMPT] * short]
    steps = 0
    for b, lengths in enumerate(batches):
        params = SamplingParams(max_tokens=DECODE_STEPS + 1, temperature=0.0, ignore_eos=True)
        for i, n in enumerate(lengths):
            engine.add_request(
                f"calibration-{round_}-{b}-{i}",
                [rng.randrange(vocab) for _ in range(n)],
                params,
                tenant=CALIBRATION_TENANT,
            )
        while engine.has_unfinished():
            engine.step()
            steps += 1
    return steps
