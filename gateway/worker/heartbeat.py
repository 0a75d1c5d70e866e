"""The worker's heartbeat thread: tells gateways it is alive and keeps its running lane entries claimed.

Every beat, in one round trip: the worker's score in ``workers:{model}`` (and ids that stopped
beating pruned), the model's max_model_len, the worker's KV blocks, running requests and live
statistics for the console (gateway/worker/live_stats.py; a hash that expires with it) and the
address of its early-start inbox (gateway/lanes/hints.py), and a re-claim of every entry it runs
that is still its own (gateway/worker/ownership.py), which resets their idle time so that no other
worker mistakes them for a dead worker's.
"""

from __future__ import annotations

import logging
import threading
import time

import orjson
import redis as redislib

from gateway.lanes.keys import (
    WORKER_ALIVE_S,
    WORKER_FORGOTTEN_S,
    WORKER_INBOX_FIELD,
    WORKER_LIVE_FIELD,
    model_info_key,
    worker_info_key,
    workers_key,
)
from gateway.worker.live_stats import PreemptionRate, live_stats
from gateway.worker.loop import Worker
from gateway.worker.reclaim import queue_reclaim, read_reclaim

log = logging.getLogger(__name__)


def beat(worker: Worker, redis: redislib.Redis, rate: PreemptionRate | None = None) -> None:
    """One heartbeat (see the module docstring); ``rate`` tracks preemptions across beats."""
    model, now = worker.model, time.time()
    pipe = redis.pipeline(transaction=False)
    pipe.zadd(workers_key(model), {worker.worker_id: now})
    pipe.zremrangebyscore(workers_key(model), "-inf", now - WORKER_FORGOTTEN_S)
    pipe.hset(model_info_key(model), "max_model_len", worker.engine.max_model_len)
    info = worker_info_key(model, worker.worker_id)
    pipe.hset(
        info,
        mapping={
            "free_blocks": worker.engine.num_free_blocks,
            "total_blocks": worker.engine.num_total_blocks,
            "running": len(worker.inflight),
            WORKER_LIVE_FIELD: orjson.dumps(live_stats(worker.engine, rate or PreemptionRate())),
            **({WORKER_INBOX_FIELD: worker.inbox.address} if worker.inbox is not None else {}),
        },
    )
    pipe.expire(info, int(WORKER_ALIVE_S))
    owned = worker.owned_entries()
    queue_reclaim(pipe, owned, worker.worker_id)
    replies = pipe.execute()
    worker.mark_ownership(read_reclaim(owned, replies[len(replies) - len(owned) :]))


def heartbeat(worker: Worker, redis: redislib.Redis, stop: threading.Event, *, every_s: float) -> None:
    """Beat at once, then every ``every_s`` seconds until ``stop`` is set (run in a thread). The
    first beat is not delayed: a restarted worker serves the requests it claims at once, and a
    gateway answers 503 to new ones until it sees the worker beat."""
    rate = PreemptionRate()
    while True:
        try:
            beat(worker, redis, rate)
        except redislib.RedisError as exc:  # keep beating; the main loop reports persistent failures
            log.warning("heartbeat failed: %s", exc)
        if stop.wait(every_s):
            return
