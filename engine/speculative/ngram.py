"""Prompt-lookup drafts: the tokens that followed the latest earlier occurrence of the sequence's
last n tokens (n from prompt_lookup_max down to prompt_lookup_min), in its own prompt + output."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.request import Sequence
from engine.speculative.config import SpeculativeConfig
from engine.speculative.policy import draft_room

if TYPE_CHECKING:
    from engine.scheduler import StepPlan


def propose(token_ids: list[int], config: SpeculativeConfig, max_tokens: int) -> list[int]:
    """Up to `max_tokens` draft tokens to follow `token_ids` (empty: no match): as far as the
    matched continuation goes."""
    k = max_tokens
    total = len(token_ids)
    if k <= 0:
        return []
    for n in range(min(config.prompt_lookup_max, total - 1), config.prompt_lookup_min - 1, -1):
        suffix = token_ids[total - n :]
        first = suffix[0]
        # the latest earlier match wins (recent context predicts best); scan backwards
        for start in range(total - n - 1, -1, -1):
            if token_ids[start] == first and token_ids[start : start + n] == suffix:
                return token_ids[start + n : start + n + k]
    return []


class NgramProposer:
    """Which running sequences speculate in a step, and their drafts (the scheduler asks)."""

    method = "ngram"

    def __init__(self, config: SpeculativeConfig, max_model_len: int):
        self.config = config
        self.max_model_len = max_model_len

    def drafts(self, seq: Sequence, budget: int, num_running: int) -> list[int]:
        """Draft tokens for `seq`'s decode this step (it has `budget` tokens beyond its one), or []
        where it does not speculate (policy.draft_room) or nothing matches."""
        room = draft_room(seq, self.config, budget, num_running, self.max_model_len)
        return propose(seq.token_ids, self.config, room) if room else []

    def complete(self, plan: StepPlan) -> None:
        """Nothing: prompt-lookup drafts are whole when the scheduler takes them."""
