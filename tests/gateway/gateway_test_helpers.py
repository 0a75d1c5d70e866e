"""Small helpers shared by gateway tests."""

from __future__ import annotations

import contextlib
import threading
import time

ADMIN_TOKEN = "test-admin-token-0123456789abcdef"


def admin_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_TOKEN}"}


async def make_tenant_key(client, name: str, **tenant_fields) -> tuple[dict, str]:
    """Create a tenant and a key over the admin API; returns (tenant, full key)."""
    response = await client.post("/admin/tenants", json={"name": name, **tenant_fields}, headers=admin_headers())
    assert response.status_code == 201, response.text
    tenant = response.json()
    response = await client.post(f"/admin/tenants/{tenant['id']}/keys", json={"name": "k"}, headers=admin_headers())
    assert response.status_code == 201, response.text
    return tenant, response.json()["key"]


def assert_openai_error(response, status: int, *, param=None, code=None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and "pydantic" not in error["message"].lower()
    assert "Traceback" not in error["message"]
    if param is not None:
        assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error
    assert response.headers.get("x-request-id")
    return error


@contextlib.contextmanager
def inproc_worker(engine, settings):
    """A real Worker over `engine` (real Redis) and its heartbeat, in threads of this process."""
    import redis as redislib

    from gateway.worker import Worker
    from gateway.worker_main import heartbeat

    model = settings.model_name
    client = redislib.Redis.from_url(settings.redis_url)
    worker = Worker(engine, client, model=model, tiers=settings.tiers, worker_id="inproc", block_ms=20)
    worker.setup()
    client.zadd(f"workers:{model}", {"inproc": time.time()})
    client.hset(f"model:{model}", "max_model_len", engine.max_model_len)
    stop = threading.Event()
    threads = [threading.Thread(target=worker.run, args=(stop,), daemon=True),
               threading.Thread(target=heartbeat, args=(worker, client, settings, stop), daemon=True)]
    for thread in threads:
        thread.start()
    try:
        yield worker, client
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=10)
        client.close()
