"""Prompt-lookup drafts: the tokens that followed the latest earlier occurrence of the sequence's
last n tokens (n from prompt_lookup_max down to prompt_lookup_min), in its own prompt + output.

Each sequence keeps an index of its n-grams (NgramIndex, on Sequence.draft_index): for every n,
the latest position each n-gram ended at. A step indexes only the tokens appended since the last
one and looks its suffixes up in a dict, so a draft costs O(prompt_lookup_max) per step whatever
the context's length (the prompt is indexed once, at the sequence's first draft)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.request import Sequence
from engine.speculative.config import SpeculativeConfig
from engine.speculative.policy import draft_room

if TYPE_CHECKING:
    from engine.scheduler import StepPlan


class NgramIndex:
    """The n-grams of one token list (n in prompt_lookup_min .. prompt_lookup_max), each mapped to
    the end of its latest occurrence; `lookup` indexes what was appended since its last call."""

    def __init__(self, tokens: list[int], config: SpeculativeConfig):
        self.tokens = tokens  # the sequence's own list: appended to, never rewritten
        self.ns = range(config.prompt_lookup_min, config.prompt_lookup_max + 1)
        self.ends: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self.ns}
        self.indexed = 0  # n-grams ending at positions < indexed are in `ends`

    def fits(self, tokens: list[int], config: SpeculativeConfig) -> bool:
        """Does this index describe `tokens` (the same list, not shorter than indexed) and config's n?"""
        return (
            tokens is self.tokens
            and len(tokens) >= self.indexed
            and self.ns == range(config.prompt_lookup_min, config.prompt_lookup_max + 1)
        )

    def lookup(self, max_tokens: int) -> list[int]:
        """Up to `max_tokens` tokens that followed the latest earlier occurrence of the longest
        suffix n-gram seen earlier, as far as they go ([]: no match)."""
        tokens, total = self.tokens, len(self.tokens)
        # index the n-grams ending before the last token's end (the suffix itself is not "earlier")
        for end in range(max(self.indexed, 1), total):
            for n in self.ns:
                if end >= n:
                    self.ends[n][tuple(tokens[end - n : end])] = end
        self.indexed = max(self.indexed, total)
        if max_tokens <= 0:
            return []
        for n in reversed(self.ns):
            if n >= total:
                continue
            after = self.ends[n].get(tuple(tokens[total - n :]))
            if after is not None:
                return tokens[after : after + max_tokens]
        return []


def propose(token_ids: list[int], config: SpeculativeConfig, max_tokens: int) -> list[int]:
    """Up to `max_tokens` draft tokens to follow `token_ids` (empty: no match): as far as the
    matched continuation goes."""
    return NgramIndex(token_ids, config).lookup(max_tokens)


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
        if not room:
            return []
        index = seq.draft_index
        if not isinstance(index, NgramIndex) or not index.fits(seq.token_ids, self.config):
            index = seq.draft_index = NgramIndex(seq.token_ids, self.config)
        return index.lookup(room)

    def complete(self, plan: StepPlan) -> None:
        """Nothing: prompt-lookup drafts are whole when the scheduler takes them."""
