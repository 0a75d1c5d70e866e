"""The garbage collector's settings for a serving process.

A replica imports a large, long-lived object graph (FastAPI, pydantic, SQLAlchemy, tokenizers and,
through the engine package, torch): a full collection walks all of it and held the event loop for
hundreds of milliseconds on a loaded 2-core machine, in the middle of requests. Once the replica
has started, ``freeze`` collects and moves everything alive into the permanent generation, which
collections skip, and raises the youngest generation's threshold so that the request path's
short-lived objects are collected in fewer, equally short passes. ``thaw`` undoes both (at
shutdown: a process that builds several apps, as tests do, gets its objects collected again).
"""

from __future__ import annotations

import gc

GEN0_THRESHOLD = 10_000  # allocations between young collections (CPython's default: 700)


def freeze(generation: int = 2) -> tuple[int, int, int]:
    """Collect up to ``generation`` (2: all), freeze what is left, raise the young threshold; returns
    the previous thresholds. A gateway replica collects its young generations only: what the oldest
    holds survived two collections, its startup leaves little garbage there, and walking it took
    0.2 s in a bare replica and a second in a process that also holds models (tests build an app
    per test); a worker collects all, as model loading can leave large tensors in cycles."""
    previous = gc.get_threshold()
    gc.collect(generation)
    gc.freeze()
    gc.set_threshold(max(previous[0], GEN0_THRESHOLD), previous[1], previous[2])
    return previous


def thaw(previous: tuple[int, int, int]) -> None:
    """Undo ``freeze``: the frozen objects are collectable again, the thresholds as they were."""
    gc.unfreeze()
    gc.set_threshold(*previous)
