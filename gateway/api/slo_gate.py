"""The SLO door check: refuse at the gateway a request that cannot meet its TTFT target.

Workers whose engine runs an SLO-aware policy publish what it predicts TTFT from (a ``LoadReport``
around the engine's ``SLOLoad``: the fitted step-cost model, the step limits, the running
sequences and the prompt tokens waiting per priority) in the hash ``load:{model}`` every ~50 ms.
Before a request is queued, the gateway predicts its TTFT on every live worker with the engine's
own ``predict_ttft`` (engine/scheduler/load.py), adding to the worker's waiting work the lane
backlog of the request's tier or above: entries no worker has read yet (XLEN - pending) times the
mean prompt this gateway has seen, plus the prompts it queued since its last read, shared among
the live workers. The best worker counts. A prediction over the request's target is a 503
``slo_unattainable`` with ``retry-after`` = the excess (whole seconds, at least 1) before anything
is queued; the engine checks again when the request arrives and at every step, so the door check
is the cheap first line, not the only one.

Cost: one Redis round trip (a pipeline) per ``cache_s`` (0.1 s) per gateway, whatever the request
rate. No live load in ``load:{model}`` (no worker runs an SLO-aware policy) means no check.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

import redis.asyncio as aioredis

from engine import predict_ttft
from gateway.api.errors import slo_unattainable
from gateway.lanes.keys import GROUP, WORKER_ALIVE_S, lane_key, load_key, tier_priorities
from gateway.lanes.messages import LoadReport, MessageError

log = logging.getLogger(__name__)
MEAN_DECAY = 0.95  # per queued request: the mean prompt follows the last ~20


@dataclass
class Snapshot:
    """One read of the live workers' loads and of the lanes' unread entries."""

    loads: list[LoadReport]
    unread: dict[str, int] = field(default_factory=dict)  # tier -> lane entries no worker has read
    read_at: float = field(default_factory=time.monotonic)


class SLOGate:
    """The door check of one gateway replica (see the module docstring)."""

    def __init__(self, redis: aioredis.Redis, *, model: str, tiers: list[str], cache_s: float = 0.1) -> None:
        self.redis, self.model, self.tiers, self.cache_s = redis, model, list(tiers), cache_s
        self.priorities = tier_priorities(self.tiers)
        self._snapshot: Snapshot | None = None
        self._lock = asyncio.Lock()
        self._queued_since: dict[str, int] = {}  # tier -> prompt tokens queued here since the last read
        self._mean_prompt: float | None = None

    def note_queued(self, tier: str, prompt_tokens: int) -> None:
        """A request was queued through this gateway (counts as backlog until the next read)."""
        self._queued_since[tier] = self._queued_since.get(tier, 0) + prompt_tokens
        mean = self._mean_prompt
        self._mean_prompt = (
            prompt_tokens if mean is None else MEAN_DECAY * mean + (1 - MEAN_DECAY) * prompt_tokens
        )

    async def snapshot(self) -> Snapshot:
        """The latest read, refreshed when older than cache_s (one read at a time)."""
        if self._stale():
            async with self._lock:
                if self._stale():
                    snapshot = await self._read()
                    self._snapshot, self._queued_since = snapshot, {}
        assert self._snapshot is not None
        return self._snapshot

    def _stale(self) -> bool:
        return self._snapshot is None or time.monotonic() - self._snapshot.read_at >= self.cache_s

    async def _read(self) -> Snapshot:
        pipe = self.redis.pipeline(transaction=False)
        pipe.time()
        pipe.hgetall(load_key(self.model))
        for tier in self.tiers:
            pipe.xlen(lane_key(self.model, tier))
            pipe.xpending(lane_key(self.model, tier), GROUP)
        replies = await pipe.execute(raise_on_error=False)
        for reply in replies[:2]:
            if isinstance(reply, Exception):
                raise reply
        (seconds, micros), raw_loads = replies[0], replies[1]
        now = seconds + micros / 1e6
        loads = []
        for worker, raw in raw_loads.items():
            try:
                report = LoadReport.decode(raw)
            except MessageError as exc:
                log.warning("ignoring the load of worker %r: %s", worker, exc)
                continue
            if report.at >= now - WORKER_ALIVE_S:
                loads.append(report)
        unread = {}
        for i, tier in enumerate(self.tiers):
            length, pending = replies[2 + 2 * i], replies[3 + 2 * i]
            if isinstance(length, int) and isinstance(pending, dict):
                unread[tier] = max(0, length - int(pending.get("pending", 0)))
            elif isinstance(length, int):  # no consumer group yet: nobody has read anything
                unread[tier] = length
        return Snapshot(loads=loads, unread=unread)

    async def predict(self, tier: str, prompt_tokens: int) -> float | None:
        """Predicted seconds to the first token on the best live worker; None without live loads."""
        snapshot = await self.snapshot()
        if not snapshot.loads:
            return None
        ahead = self.tiers[: self.tiers.index(tier) + 1]  # workers pull higher tiers first
        mean = self._mean_prompt if self._mean_prompt is not None else prompt_tokens
        queued = sum(snapshot.unread.get(t, 0) * mean + self._queued_since.get(t, 0) for t in ahead)
        share = queued / len(snapshot.loads)
        priority = self.priorities[tier]
        return min(
            predict_ttft(report.load, prompt_tokens, priority, queued_tokens=share)
            for report in snapshot.loads
        )

    async def check(self, *, tier: str, prompt_tokens: int, ttft_target_s: float) -> float | None:
        """Raise SLOUnattainable if the request cannot meet ``ttft_target_s``; else the prediction."""
        predicted = await self.predict(tier, prompt_tokens)
        if predicted is not None and predicted > ttft_target_s:
            raise slo_unattainable(ttft_target_s, predicted)
        return predicted
