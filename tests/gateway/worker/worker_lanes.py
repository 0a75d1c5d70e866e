"""What the worker tests put in the lanes and read back from Redis: a lane request, a request's
published results, a lane's pending entries, and a worker run until its requests are done; and the
reference they compare with: an engine's greedy tokens."""

from __future__ import annotations

import uuid

from engine import SamplingParams
from gateway.lanes.keys import GROUP, cancel_key, lane_key, out_key
from gateway.lanes.messages import LaneRequest, LaneResult
from gateway.worker.loop import Worker


def lane_request(model, tier, *, max_tokens=1, prompt=(5, 6, 7, 8), tenant="acme") -> LaneRequest:
    """A greedy request of ``max_tokens`` that ignores EOS, with an id of its own."""
    return LaneRequest(
        request_id=f"req-{uuid.uuid4().hex[:12]}",
        model=model,
        tier=tier,
        tenant=tenant,
        prompt_token_ids=tuple(prompt),
        sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
    )


def pending(redis, model, tier) -> int:
    """Entries of the lane taken by a worker and not ACKed yet."""
    return redis.xpending(lane_key(model, tier), GROUP)["pending"]


def cleanup(redis, rids):
    """The result streams and cancel marks of ``rids``."""
    redis.delete(*(out_key(r) for r in rids), *(cancel_key(r) for r in rids))


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
