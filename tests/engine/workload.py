"""A random workload for the engine tests: arrivals and aborts, one engine step at a time."""

import random

from engine import Engine, SamplingParams


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)


def random_workload(eng: Engine, rng: random.Random, steps: int):
    """Each step: maybe a request (1-40 prompt tokens, 1-40 output tokens), maybe an abort of a
    live one, then one engine step; yields the step number after it so the caller can check."""
    live = set()
    for step in range(steps):
        if rng.random() < 0.3:
            rid = f"r{step}"
            n = rng.randint(1, 40)
            eng.add_request(rid, [rng.randrange(2, 256) for _ in range(n)], greedy(rng.randint(1, 40)))
            live.add(rid)
        if live and rng.random() < 0.1:
            eng.abort(rng.choice(sorted(live)))
        for o in eng.step():
            if o.finished:
                live.discard(o.request_id)
        live &= set(eng.seqs)
        yield step
