"""/ready (gateway/api/routes/health.py) says why the lanes' Redis fails: an authentication error
lasts until the URL is fixed and was indistinguishable from an outage (a 503 for ever, "redis":
false). Logged once when it starts, not on every probe."""

from __future__ import annotations

import logging

import redis as redislib
from gateway_test_helpers import inproc_gateway


async def test_ready_names_a_redis_that_refuses_the_password(settings, start_valkey, caplog):
    server = start_valkey()
    try:
        own = settings.model_copy(update={"redis_url": f"redis://:first-pw@127.0.0.1:{server.port}/0"})
        admin = redislib.Redis(port=server.port)
        admin.config_set("requirepass", "first-pw")
        admin = redislib.Redis(port=server.port, password="first-pw")
        async with inproc_gateway(own) as gw:
            before = (await gw.http.get("/ready")).json()
            assert before["checks"]["redis"] and "reasons" not in before
            admin.config_set("requirepass", "second-pw")  # the password changed under the gateway
            admin.client_kill_filter(_type="normal", skipme=True)  # its connections authenticate again
            with caplog.at_level(logging.INFO, logger="gateway.api.routes.health"):
                for _ in range(3):
                    response = await gw.http.get("/ready")
                    body = response.json()
                    assert response.status_code == 503 and body["checks"]["redis"] is False
                    assert body["reasons"]["redis"].startswith("authentication to Redis failed")
                    assert "first-pw" not in response.text and "second-pw" not in response.text
                assert caplog.text.count("not ready: authentication to Redis failed") == 1
                admin.config_set("requirepass", "first-pw")
                assert "reasons" not in (await gw.http.get("/ready")).json()
                assert "ready: Redis answers again" in caplog.text
        admin.close()
    finally:
        server.stop()
