"""The app's lifespan: the GC policy's freeze runs before the loop-lag monitor starts, so that the
startup's one full collection is not reported as a pause of serving, while later ones are."""

from __future__ import annotations

import asyncio
import gc

from prometheus_client.registry import REGISTRY

from gateway.api.app import create_app


def _full_collections() -> float:
    return REGISTRY.get_sample_value("fairlane_gc_pause_seconds_count", {"generation": "2"}) or 0.0


async def test_the_startup_collection_is_not_a_reported_pause_and_later_ones_are(settings):
    before = _full_collections()
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        started = _full_collections()
        gc.collect()  # a full collection while serving
        await asyncio.sleep(0.1)  # the monitor observes the pause on its next tick (10 ms)
        serving = _full_collections()
    assert started == before
    assert serving == before + 1
