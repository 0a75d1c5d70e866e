"""GET /metrics: Prometheus text of this replica and, under ``fairlane serve``, of the workers it
started (multiprocess mode), plus what is read at scrape time: lane depths and whether the quota
store answers."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.core import GaugeMetricFamily

from gateway.api.deps import StateDep
from gateway.lanes.keys import GROUP, lane_key
from gateway.telemetry import metrics

router = APIRouter(tags=["operations"])
PROBE_TIMEOUT_S = 1.0  # a quota store slower than this to answer PING is reported down


class _ScrapeTime:
    """Gauges measured for this scrape (one series each per tier)."""

    def __init__(
        self, depth: dict[str, int], pending: dict[str, int], quota_up: bool, ttft_targets: dict[str, float]
    ) -> None:
        self.depth, self.pending, self.quota_up, self.ttft_targets = depth, pending, quota_up, ttft_targets

    def collect(self):
        depth = GaugeMetricFamily(
            "fairlane_lane_depth", "Requests in a lane that no worker has taken yet", labels=["tier"]
        )
        pending = GaugeMetricFamily(
            "fairlane_lane_pending", "Requests a worker has taken and not finished", labels=["tier"]
        )
        for tier in self.depth:
            depth.add_metric([tier], self.depth[tier])
            pending.add_metric([tier], self.pending[tier])
        yield depth
        yield pending
        targets = GaugeMetricFamily(
            "fairlane_tier_ttft_target_seconds",
            "The tier's TTFT target (settings: tier_ttft_targets), for alerts on the TTFT p99",
            labels=["tier"],
        )
        for tier, target in self.ttft_targets.items():
            targets.add_metric([tier], target)
        yield targets
        yield GaugeMetricFamily(
            "fairlane_quota_store_up",
            "1 if the quota Redis answered this scrape's PING",
            value=1.0 if self.quota_up else 0.0,
        )


async def _lanes(state) -> tuple[dict[str, int], dict[str, int]]:
    tiers = state.settings.tiers
    async with state.redis.pipeline(transaction=False) as pipe:
        for tier in tiers:
            pipe.xlen(lane_key(state.settings.model_name, tier))
            pipe.xpending(lane_key(state.settings.model_name, tier), GROUP)
        replies = await pipe.execute(raise_on_error=False)
    depth, pending = {}, {}
    for i, tier in enumerate(tiers):
        length, info = replies[2 * i], replies[2 * i + 1]
        taken = info.get("pending", 0) if isinstance(info, dict) else 0
        length = length if isinstance(length, int) else 0
        depth[tier], pending[tier] = max(0, length - taken), taken
    return depth, pending


async def _quota_up(state) -> bool:
    limiter = state.quota_service.limiter
    if limiter is None:
        return True
    try:
        return bool(await asyncio.wait_for(limiter.redis.ping(), PROBE_TIMEOUT_S))
    except Exception:  # down, slow or refusing: that is what this gauge reports
        return False


@router.get("/metrics", include_in_schema=False)
async def prometheus_metrics(state: StateDep) -> Response:
    """Prometheus metrics (text exposition format)."""
    try:
        depth, pending = await _lanes(state)
    except Exception:  # the lanes' Redis is down: the scrape still reports everything else
        depth, pending = {}, {}
    scrape_time = _ScrapeTime(depth, pending, await _quota_up(state), state.settings.tier_ttft_targets)
    body = metrics.render(scrape_time)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
