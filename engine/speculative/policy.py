"""Which running sequences speculate in a step, and how many drafts they may take: one rule for
every drafting method."""

from __future__ import annotations

from engine.request import Sequence
from engine.speculative.config import SpeculativeConfig


def draft_room(
    seq: Sequence, config: SpeculativeConfig, budget: int, num_running: int, max_model_len: int
) -> int:
    """How many drafts `seq`'s decode may take this step (it has `budget` tokens beyond its one):
    0 where it does not speculate: a batch above max_decoding_seqs, a priority below min_priority,
    a grammar (drafts are not checked against it), penalties, logit_bias or min_tokens (they change
    with every accepted token). Capped at k, and so that neither max_tokens nor the context is passed."""
    params = seq.params
    if (
        num_running > config.max_decoding_seqs
        or seq.priority < config.min_priority
        or params.structured is not None
        or params.processes_logits
    ):
        return 0
    return max(
        0,
        min(
            config.num_speculative_tokens,
            budget,
            params.max_tokens - seq.num_output_tokens - 1,  # the bonus token is the last one allowed
            max_model_len - seq.num_tokens,  # the last draft's position stays inside the context
        ),
    )
