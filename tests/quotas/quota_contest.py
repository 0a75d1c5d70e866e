"""The "gateway processes" of the exactness contest (imported by spawned processes).

Not a test module: ``test_admission_exactness`` keeps two of these processes for the session
(spawning costs ~1 s each) and hands each contest to both.
"""

from __future__ import annotations

import asyncio

from quotas import Demand, KeySpace, Limiter, connect


def serve(jobs, results, barrier) -> None:
    """Run contests from ``jobs`` until a None arrives; answer each on ``results``.

    A job is (url, key prefix, [(prompt_tokens, max_tokens), ...], injected now or None);
    the answer is ``[(allowed, limit, tokens), ...]``, or the error's text.
    """
    while (job := jobs.get()) is not None:
        try:
            results.put(asyncio.run(_fire(*job, barrier)))
        except BaseException as exc:  # reported to the test, which fails with it
            barrier.abort()
            results.put(f"{type(exc).__name__}: {exc}")


async def _fire(url, prefix, sizes, now, barrier):
    client = connect(url, timeout=10.0)  # 2 cores, 400 callers: be patient, not failing
    limiter = Limiter(client, keys=KeySpace(prefix))
    await limiter.scripts.load()
    barrier.wait()  # both processes connected and loaded: start together
    decisions = await asyncio.gather(*(limiter.admit(Demand("contested", p, m), now=now) for p, m in sizes))
    await client.aclose()
    return [(d.allowed, d.limit, p + m) for d, (p, m) in zip(decisions, sizes)]
