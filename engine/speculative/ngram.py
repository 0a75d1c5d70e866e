"""Prompt-lookup drafts: the tokens that followed the latest earlier occurrence of the sequence's
last n tokens (n from prompt_lookup_max down to prompt_lookup_min), in its own prompt + output."""

from __future__ import annotations

from engine.request import Sequence
from engine.speculative.config import SpeculativeConfig, parse_speculative_config


def propose(token_ids: list[int], config: SpeculativeConfig, max_tokens: int) -> list[int]:
    """Up to `max_tokens` draft tokens to follow `token_ids` (empty: no match)."""
    k = min(config.num_speculative_tokens, max_tokens)
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
        where it does not speculate: a batch above max_decoding_seqs, a priority below min_priority,
        a grammar (drafts are not checked against it), penalties, logit_bias or min_tokens (they
        change with every accepted token)."""
        params = seq.params
        if (
            num_running > self.config.max_decoding_seqs
            or seq.priority < self.config.min_priority
            or params.structured is not None
            or params.processes_logits
        ):
            return []
        room = min(
            budget,
            params.max_tokens - seq.num_output_tokens - 1,  # the bonus token is the last one allowed
            self.max_model_len - seq.num_tokens,  # the last draft's position stays inside the context
        )
        return propose(seq.token_ids, self.config, room)


def make_drafter(speculative_config: dict | None, max_model_len: int) -> NgramProposer | None:
    """The scheduler's drafter for EngineConfig.speculative_config (None: speculation off)."""
    config = parse_speculative_config(speculative_config)
    return NgramProposer(config, max_model_len) if config is not None else None
