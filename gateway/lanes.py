"""Priority lanes on Redis Streams: key names and the gateway's side of the protocol.

- ``lanes:{model}:{tier}``: one stream per model and tier; workers read it through the consumer
  group ``workers``, ACK and delete an entry when its request finishes (lanes never grow).
- ``out:{request_id}``: the request's results, written by the worker each step; it expires
  ``result_ttl_s`` after its last write and the gateway deletes it once relayed.
- ``cancel:{request_id}``: set by a gateway whose client went away; workers check it every step.
- ``workers:{model}``: sorted set of worker ids scored by their last heartbeat (unix seconds),
  so a gateway knows whether the model is served; workers prune ids that stopped beating.
- ``model:{model}`` (max_model_len) and ``worker:{model}:{worker_id}`` (KV blocks; expires).
- ``load:{model}``: hash worker id → ``WorkerLoad`` (what its SLO-aware engine predicts TTFT
  from), refreshed every ~50 ms by workers whose policy is SLO-aware; read by the door check.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import redis.asyncio as aioredis

from gateway.messages import LaneRequest, LaneResult

GROUP = "workers"


def lane_key(model: str, tier: str) -> str:
    return f"lanes:{model}:{tier}"


def out_key(request_id: str) -> str:
    return f"out:{request_id}"


def cancel_key(request_id: str) -> str:
    return f"cancel:{request_id}"


def workers_key(model: str) -> str:
    return f"workers:{model}"


def model_info_key(model: str) -> str:
    """Hash written by workers: the model's max_model_len."""
    return f"model:{model}"


def worker_info_key(model: str, worker_id: str) -> str:
    """Hash of one worker's live state (free_blocks, total_blocks, running); expires with the worker."""
    return f"worker:{model}:{worker_id}"


def load_key(model: str) -> str:
    """Hash of the workers' WorkerLoad messages (field: worker id); see gateway/slo_gate.py."""
    return f"load:{model}"


def tier_priorities(tiers: list[str]) -> dict[str, int]:
    """Tier name → the engine's priority number (higher is more important; tiers are highest first)."""
    return {tier: len(tiers) - i for i, tier in enumerate(tiers)}


WORKER_ALIVE_S = 5.0  # a worker that has not beaten for this long is gone
WORKER_SEEN_S = 1.0  # a replica trusts a live worker it saw this long without asking Redis again


class ResultTimeout(Exception):
    """No result arrived for a request within the wait limit."""


class LaneClient:
    """Submit requests to lanes, relay their results, cancel them (async, one per gateway)."""

    def __init__(self, redis: aioredis.Redis, *, result_ttl_s: int = 300, poll_ms: int = 1000) -> None:
        self.redis = redis
        self.result_ttl_s = result_ttl_s
        self.poll_ms = poll_ms
        self._worker_seen: dict[str, float] = {}  # model → when a live worker was last seen (monotonic)

    @staticmethod
    def entry(request: LaneRequest) -> tuple[str, dict[str, str]]:
        """The lane stream and the stream entry of a request: what ``submit`` adds."""
        return lane_key(request.model, request.tier), request.encode()

    async def submit(self, request: LaneRequest) -> str:
        """XADD the request to its lane; returns the entry id."""
        entry_id = await self.redis.xadd(*self.entry(request))
        return entry_id.decode() if isinstance(entry_id, bytes) else entry_id

    async def results(self, request_id: str, *, timeout_s: float) -> AsyncIterator[LaneResult]:
        """Every result of a request in order, until a finished one; drops chunks already seen.

        Raises ResultTimeout if nothing arrives for ``timeout_s`` seconds.
        """
        key, last_id, relayed, idle_ms = out_key(request_id), "0-0", 0, 0.0
        while True:
            reply = await self.redis.xread({key: last_id}, block=self.poll_ms, count=256)
            if not reply:
                idle_ms += self.poll_ms
                if idle_ms >= timeout_s * 1000:
                    raise ResultTimeout(f"no result for {request_id} in {timeout_s:.0f} s")
                continue
            idle_ms = 0.0
            for entry_id, fields in reply[0][1]:
                last_id = entry_id
                result = LaneResult.decode(fields)
                if result.kind == "tokens" and result.offset + len(result.token_ids) <= relayed and result.token_ids:
                    continue  # a chunk we have already relayed
                relayed = max(relayed, result.offset + len(result.token_ids))
                yield result
                if result.finished:
                    return

    async def cancel(self, request_id: str) -> None:
        """Ask whichever worker holds the request to abort it (seen within one engine step)."""
        await self.redis.set(cancel_key(request_id), b"1", ex=self.result_ttl_s)

    async def discard(self, request_id: str) -> None:
        """Drop a relayed request's result stream."""
        await self.redis.delete(out_key(request_id))

    async def has_worker(self, model: str) -> bool:
        """Whether a worker serving ``model`` beat within WORKER_ALIVE_S (by Redis's clock).

        It is asked on every request: a live worker once seen is trusted for WORKER_SEEN_S, so
        Redis is asked at most about once a second per model while workers are up. A worker that
        dies meanwhile is like one dying just after the check: its requests wait in the lane.
        """
        seen = time.monotonic()
        if seen - self._worker_seen.get(model, float("-inf")) < WORKER_SEEN_S:
            return True
        async with self.redis.pipeline(transaction=False) as pipe:  # one round trip
            pipe.time()
            pipe.zrange(workers_key(model), -1, -1, withscores=True)  # the latest beat
            (now_s, _), latest = await pipe.execute()
        alive = bool(latest) and latest[0][1] >= now_s - WORKER_ALIVE_S
        if alive:
            self._worker_seen[model] = seen
        return alive
