"""The prompts of benchmarks.scheduling: random sequences of whole-word tokens, in process and over
HTTP alike.

A prompt of random token ids from anywhere in the vocabulary (byte pieces, fragments of CJK
characters) makes the model answer in such pieces too, and a token that completes no character
reaches a streaming client only with the token that completes it: its first visible text waits one
or two more steps. Under load a step is long, so over HTTP that showed as 180-260 ms between the
gateway's first token and the client's first chunk for the light tenant's slowest request, which
was the prompts, not the scheduler. Whole English words, as users' prompts mostly are, leave the
first token's text whole.
"""

from __future__ import annotations

import random
import re

WORD = re.compile(r" ?[A-Za-z]{2,}")
ID_RANGE = (100, 40000)  # ids outside this range are left out (specials, the rarest merges)


_WORD_IDS: dict[tuple[str, int], list[int]] = {}  # (tokenizer's name or path, its size) -> word_ids


def word_ids(tokenizer) -> list[int]:
    """Ids of the vocabulary (within ID_RANGE) whose text alone is one word, with or without its space.
    Worked out once per tokenizer in a process (a decode of 40,000 ids: a fraction of a second, which
    every run on a fresh engine of benchmarks.scheduling paid again)."""
    key = (tokenizer.name_or_path, len(tokenizer))
    if key not in _WORD_IDS:
        lo, hi = ID_RANGE
        texts = tokenizer.batch_decode([[i] for i in range(lo, hi)])
        _WORD_IDS[key] = [i for i, text in zip(range(lo, hi), texts) if WORD.fullmatch(text)]
    return _WORD_IDS[key]


def prompt(rng: random.Random, ids: list[int], length: int) -> list[int]:
    """``length`` token ids drawn from ``ids``."""
    return [ids[rng.randrange(len(ids))] for _ in range(length)]
