"""Benchmark workloads: deterministic chat prompts of mixed lengths and mixed output budgets."""

from __future__ import annotations

import random

TOPICS = [
    "the history of tea",
    "how rainbows form",
    "writing clean Python",
    "the life of bees",
    "saving money",
    "black holes",
    "learning to cook rice",
    "the French revolution",
    "training for a marathon",
    "how vaccines work",
    "the rules of chess",
    "volcanoes",
]
WORDS = (
    "river stone market light quiet engine garden winter letter window shadow music paper "
    "mountain signal harbor lantern forest silver morning question bridge thunder velvet "
    "circle garden orbit meadow canyon pocket ribbon anchor"
).split()


def chat_prompts(tokenizer, n: int, seed: int = 0, min_len: int = 16, max_len: int = 512) -> list[list[int]]:
    """n chat prompts whose token lengths spread over [min_len, max_len] (a few long ones)."""
    rng = random.Random(seed)
    prompts = []
    for i in range(n):
        target = rng.randint(min_len, 128) if rng.random() < 0.75 else rng.randint(128, max_len)
        notes = " ".join(rng.choice(WORDS) for _ in range(max(0, target - 30)))
        msg = f"Tell me about {TOPICS[i % len(TOPICS)]}." + (f" Use these notes: {notes}" if notes else "")
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": msg}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        prompts.append(list(ids)[:max_len])
    return prompts


def output_budgets(n: int, seed: int = 0, low: int = 16, high: int = 512) -> list[int]:
    """max_tokens per request: mostly short, some medium, a few long (up to `high`)."""
    rng = random.Random(seed + 1)
    out = []
    for _ in range(n):
        r = rng.random()
        band = (low, high // 4) if r < 0.7 else (high // 4, high // 2) if r < 0.9 else (high * 3 // 4, high)
        out.append(rng.randint(*band))
    return out


def long_tailed_budgets(n: int, seed: int = 0) -> list[int]:
    """max_tokens per request, long-tailed: 80% between 8 and 48, 20% between 160 and 256."""
    rng = random.Random(seed + 2)
    return [rng.randint(8, 48) if rng.random() < 0.8 else rng.randint(160, 256) for _ in range(n)]
