"""One "gateway process" of the exactness contest (imported by spawned processes).

Not a test module: ``test_admission_exactness`` starts two of these with multiprocessing.
"""

from __future__ import annotations

import asyncio

from quotas import Demand, KeySpace, Limiter, connect


def run(url: str, prefix: str, sizes: list[tuple[int, int]], now: float | None,
        barrier, results) -> None:
    """Fire one admission per (prompt_tokens, max_tokens) in ``sizes``, all at once.

    Puts ``[(allowed, limit, tokens), ...]`` on ``results``, or the error's text.
    """
    try:
        results.put(asyncio.run(_fire(url, prefix, sizes, now, barrier)))
    except BaseException as exc:  # reported to the test, which fails with it
        barrier.abort()
        results.put(f"{type(exc).__name__}: {exc}")


async def _fire(url, prefix, sizes, now, barrier):
    client = connect(url, timeout=10.0)  # 2 cores, 400 callers: be patient, not failing
    limiter = Limiter(client, keys=KeySpace(prefix))
    await limiter.scripts.load()
    barrier.wait()  # both processes connected and loaded: start together
    decisions = await asyncio.gather(
        *(limiter.admit(Demand("contested", p, m), now=now) for p, m in sizes)
    )
    await client.aclose()
    return [(d.allowed, d.limit, p + m) for d, (p, m) in zip(decisions, sizes)]
