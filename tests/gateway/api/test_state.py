"""A replica's close: each part closed even when another's close fails. The failure is real: the
quota's own Redis server (the embedded Valkey) stopped with SIGSTOP while a command of the quota
client is half sent, so that closing its connection times out in redis-py."""

from __future__ import annotations

import asyncio
import logging
import signal

from gateway.api.state import GatewayState
from gateway.cli.embedded_redis import EmbeddedRedis


async def test_a_quota_client_that_cannot_close_leaves_the_rest_closed(settings, caplog):
    server = EmbeddedRedis()
    process = server.spawn()
    state = GatewayState.open(settings.model_copy(update={"quota_redis_url": server.url}))
    quota_redis = state.quota_service.limiter.redis
    try:
        await quota_redis.ping()
        await state.redis.ping()  # the lanes' Redis (the test server) has a connection to close
        process.send_signal(signal.SIGSTOP)
        half_sent = asyncio.ensure_future(quota_redis.set("big", b"x" * (64 << 20)))
        await asyncio.sleep(0.05)  # the command is half sent; its own 0.5 s reply timeout is not up
        with caplog.at_level(logging.WARNING, logger="gateway.api.state"):
            await state.close()  # does not raise
        assert any("quotas" in r.getMessage() for r in caplog.records)
        pool = state.redis.connection_pool
        assert not any(c.is_connected for c in [*pool._available_connections, *pool._in_use_connections])
        half_sent.cancel()
        await asyncio.gather(half_sent, return_exceptions=True)
    finally:
        process.send_signal(signal.SIGCONT)
        process.kill()
        process.wait()
        server.remove()
