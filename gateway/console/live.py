"""The live view's data, read from Redis only (never the database): the lanes (entries no worker has
read, and how long the oldest has waited) and what each worker publishes with its heartbeat
(gateway/worker/live_stats.py): running sequences per tenant, latencies per priority, KV blocks,
preemptions per minute, the adapters it holds. Four round trips per refresh, whatever the number of
workers and lanes (pipelines)."""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson
import redis.asyncio as aioredis

from gateway.lanes.keys import (
    GROUP,
    WORKER_ALIVE_S,
    WORKER_LIVE_FIELD,
    lane_key,
    tier_priorities,
    worker_info_key,
    workers_key,
)
from gateway.settings import ApiSettings


@dataclass(frozen=True)
class LaneView:
    tier: str
    queued: int  # entries no worker has read yet
    running: int  # read by a worker, not finished
    oldest_wait_s: float | None  # of the queued entries


@dataclass(frozen=True)
class WorkerView:
    worker: str
    running: int
    waiting: int
    kv_used: int
    kv_total: int
    preemptions_per_min: float
    adapters: list[str]
    tenants: dict[str, dict]
    latency: dict[str, dict]


@dataclass(frozen=True)
class TenantShare:
    tenant: str  # the tenant's id as the engine knows it
    running: int
    weight: float
    fair_share: float  # running sequences its weight entitles it to, of all running now


@dataclass(frozen=True)
class TierLatency:
    tier: str
    sequences: int
    ttft_s: float | None
    tpot_s: float | None
    ttft_target_s: float | None
    tpot_target_s: float | None


@dataclass
class LiveView:
    lanes: list[LaneView]
    workers: list[WorkerView]
    tenants: list[TenantShare] = field(default_factory=list)
    latency: list[TierLatency] = field(default_factory=list)

    @property
    def kv_used(self) -> int:
        return sum(w.kv_used for w in self.workers)

    @property
    def kv_total(self) -> int:
        return sum(w.kv_total for w in self.workers)

    @property
    def preemptions_per_min(self) -> float:
        return sum(w.preemptions_per_min for w in self.workers)


def _s(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def read_workers(redis: aioredis.Redis, model: str) -> list[WorkerView]:
    """The live workers of ``model`` and what their last heartbeat published."""
    seconds, _micros = await redis.time()
    ids = [_s(w) for w in await redis.zrangebyscore(workers_key(model), seconds - WORKER_ALIVE_S, "+inf")]
    pipe = redis.pipeline(transaction=False)
    for worker in ids:
        pipe.hgetall(worker_info_key(model, worker))
    views = []
    for worker, info in zip(ids, await pipe.execute()):
        info = {_s(k): v for k, v in info.items()}
        live = orjson.loads(info[WORKER_LIVE_FIELD]) if WORKER_LIVE_FIELD in info else {}
        total = int(info.get("total_blocks", 0))
        views.append(
            WorkerView(
                worker=worker,
                running=int(info.get("running", 0)),
                waiting=int(live.get("waiting", 0)),
                kv_used=int(live.get("kv_used", total - int(info.get("free_blocks", total)))),
                kv_total=total,
                preemptions_per_min=float(live.get("preemptions_per_min", 0.0)),
                adapters=list(live.get("adapters", [])),
                tenants=live.get("tenants", {}),
                latency=live.get("latency", {}),
            )
        )
    return views


async def read_lanes(redis: aioredis.Redis, model: str, tiers: list[str]) -> list[LaneView]:
    pipe = redis.pipeline(transaction=False)
    pipe.time()
    for tier in tiers:
        pipe.xlen(lane_key(model, tier))
        pipe.xpending(lane_key(model, tier), GROUP)
    replies = await pipe.execute(raise_on_error=False)
    seconds, micros = replies[0]
    now_ms = seconds * 1000 + micros // 1000
    lanes = []
    for i, tier in enumerate(tiers):
        length, info = replies[1 + 2 * i], replies[2 + 2 * i]
        length = length if isinstance(length, int) else 0
        pending = int(info.get("pending", 0)) if isinstance(info, dict) else 0
        lanes.append((tier, max(0, length - pending), pending))
    # Workers take a lane's entries least-served tenant first, not in order: the oldest waiting
    # entry is the oldest one no worker holds (every held one is pending; finished ones are deleted).
    pipe = redis.pipeline(transaction=False)
    for tier, _queued, pending in lanes:
        pipe.xrange(lane_key(model, tier), count=pending + 1)
        pipe.xpending_range(lane_key(model, tier), GROUP, min="-", max="+", count=max(pending, 1))
    oldest = await pipe.execute(raise_on_error=False)
    views = []
    for i, (tier, queued, pending) in enumerate(lanes):
        first, held = oldest[2 * i], oldest[2 * i + 1]
        held_ids = {_s(p["message_id"]) for p in held} if isinstance(held, list) else set()
        waiting = [_s(e[0]) for e in first if _s(e[0]) not in held_ids] if isinstance(first, list) else []
        wait = None
        if queued and waiting:
            wait = max(0.0, (now_ms - int(waiting[0].split("-")[0])) / 1000)
        views.append(LaneView(tier=tier, queued=queued, running=pending, oldest_wait_s=wait))
    return views


def tenant_shares(workers: list[WorkerView]) -> list[TenantShare]:
    """Running sequences per tenant over all workers, beside the share its weight entitles it to."""
    running: dict[str, int] = {}
    weights: dict[str, float] = {}
    for worker in workers:
        for tenant, item in worker.tenants.items():
            running[tenant] = running.get(tenant, 0) + int(item["running"])
            weights[tenant] = float(item.get("weight", 1.0))
    total, weight_sum = sum(running.values()), sum(weights.values())
    return [
        TenantShare(tenant=t, running=n, weight=weights[t], fair_share=total * weights[t] / weight_sum)
        for t, n in sorted(running.items(), key=lambda item: -item[1])
    ]


def tier_latencies(workers: list[WorkerView], settings: ApiSettings) -> list[TierLatency]:
    """Mean TTFT and TPOT of the running sequences of each tier, beside the tier's targets."""
    views = []
    for tier, priority in tier_priorities(settings.tiers).items():
        items = [w.latency[str(priority)] for w in workers if str(priority) in w.latency]
        n = sum(i["sequences"] for i in items)
        tpots = [i["tpot_s"] for i in items if i.get("tpot_s") is not None]
        ttft_target, tpot_target = settings.slo_targets(tier)
        views.append(
            TierLatency(
                tier=tier,
                sequences=n,
                ttft_s=sum(i["ttft_s"] * i["sequences"] for i in items) / n if n else None,
                tpot_s=sum(tpots) / len(tpots) if tpots else None,
                ttft_target_s=ttft_target,
                tpot_target_s=tpot_target,
            )
        )
    return views


async def read_live(redis: aioredis.Redis, settings: ApiSettings) -> LiveView:
    model = settings.model_name
    workers = await read_workers(redis, model)
    return LiveView(
        lanes=await read_lanes(redis, model, settings.tiers),
        workers=workers,
        tenants=tenant_shares(workers),
        latency=tier_latencies(workers, settings),
    )
