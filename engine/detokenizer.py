"""Incremental detokenization that never splits a multi-byte character, and stop-string search."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

REPLACEMENT = "\ufffd"
# Tokens decoded again before the unread ones, so merges and leading spaces come out right.
CONTEXT_TOKENS = 5


@dataclass
class DetokState:
    prefix_offset: int  # start of the context window in the output tokens
    read_offset: int  # output tokens already turned into text
    text: str = ""  # text emitted so far
    emitted: int = 0  # characters of `text` already handed out (held back while a stop string may start)


class Detokenizer:
    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer

    def start(self, num_resumed_tokens: int = 0) -> DetokState:
        off = num_resumed_tokens
        return DetokState(prefix_offset=max(0, off - CONTEXT_TOKENS), read_offset=off)

    def step(self, state: DetokState, output_ids: list[int]) -> str:
        """Append the text of output_ids[state.read_offset:]; returns the new text (maybe empty)."""
        if state.read_offset >= len(output_ids):
            return ""
        decode = self.tokenizer.decode
        prefix = decode(output_ids[state.prefix_offset : state.read_offset], skip_special_tokens=True)
        full = decode(output_ids[state.prefix_offset :], skip_special_tokens=True)
        if full.endswith(REPLACEMENT) or len(full) <= len(prefix):
            return ""  # an incomplete UTF-8 sequence (or nothing visible yet): wait for more tokens
        new = full[len(prefix) :]
        state.prefix_offset = max(state.read_offset, len(output_ids) - CONTEXT_TOKENS)
        state.read_offset = len(output_ids)
        state.text += new
        return new


def find_stop(text: str, new_len: int, stops: tuple[str, ...]) -> int:
    """Index where the earliest stop string begins in text, looking only where the last
    `new_len` characters could complete one; -1 if none."""
    if not stops:
        return -1
    best = -1
    for s in stops:
        start = max(0, len(text) - new_len - len(s) + 1)
        i = text.find(s, start)
        if i != -1 and (best == -1 or i < best):
            best = i
    return best


def holdback(text: str, stops: tuple[str, ...]) -> int:
    """How many trailing characters might be the start of a stop string (not yet safe to emit)."""
    keep = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), keep, -1):
            if s.startswith(text[-k:]):
                keep = k
                break
    return keep
