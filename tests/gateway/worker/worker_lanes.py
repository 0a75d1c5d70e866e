"""What the worker tests read back from Redis: a request's published results, and a worker run until
its requests are done; and the reference they compare with: an engine's greedy tokens."""

from __future__ import annotations

from engine import SamplingParams
from gateway.lanes.keys import out_key
from gateway.lanes.messages import LaneResult
from gateway.worker.loop import Worker


def results(redis, rid) -> list[LaneResult]:
    return [LaneResult.decode(fields) for _id, fields in redis.xrange(out_key(rid))]


def make_worker(engine, redis, model, tiers, **kw) -> Worker:
    """A worker of ``model`` on ``tiers`` (id ``w1`` unless given; short blocking reads), set up."""
    worker = Worker(
        engine, redis, model=model, tiers=tiers, worker_id=kw.pop("worker_id", "w1"), block_ms=10, **kw
    )
    worker.setup()
    return worker


def run_until_done(worker, redis, rids, max_iters=500):
    for _ in range(max_iters):
        worker.run_once()
        if all(r and r[-1].done for r in (results(redis, rid) for rid in rids)):
            return
    raise AssertionError("requests did not finish")


def greedy(engine, prompt, max_tokens) -> list[int]:
    """The tokens ``engine`` generates greedily for ``prompt`` on its own (the reference)."""
    engine.add_request(
        "ref", list(prompt), SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    )
    tokens = []
    while engine.has_unfinished():
        for out in engine.step():
            tokens += out.new_token_ids
    return tokens
