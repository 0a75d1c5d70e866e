"""Small helpers shared by gateway tests."""

from __future__ import annotations

import contextlib
import threading
import time
from datetime import UTC, datetime, timedelta

import httpx

from benchmarks.common import TINY_DUMMY_SHAPE

ADMIN_TOKEN = "test-admin-token-0123456789abcdef"
HEARTBEAT_S = 0.5  # the in-process worker's (the settings' default)
# A tiny Llama: fast enough to run hundreds of requests on 2 CPU cores.
TINY = {**TINY_DUMMY_SHAPE, "max_position_embeddings": 256}
# The engine section of the gateway settings the tests use (the workers are built by tiny_engine_factory).
TINY_ENGINE = dict(
    model="dummy",
    dummy_config=TINY,
    num_kv_blocks=64,
    max_num_seqs=16,
    max_num_batched_tokens=512,
    num_threads=1,
)


def chat_body(settings, **extra) -> dict:
    """A greedy chat request of four tokens (``extra`` overrides or adds fields)."""
    return {
        "model": settings.model_name,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 4,
        "ignore_eos": True,
        "temperature": 0,
        **extra,
    }


def admin_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_TOKEN}"}


async def make_tenant_key(client, name: str, **tenant_fields) -> tuple[dict, str]:
    """Create a tenant and a key over the admin API; returns (tenant, full key)."""
    response = await client.post(
        "/admin/tenants", json={"name": name, **tenant_fields}, headers=admin_headers()
    )
    assert response.status_code == 201, response.text
    tenant = response.json()
    response = await client.post(
        f"/admin/tenants/{tenant['id']}/keys", json={"name": "k"}, headers=admin_headers()
    )
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

    from gateway.worker.heartbeat import heartbeat
    from gateway.worker.loop import Worker

    model = settings.model_name
    client = redislib.Redis.from_url(settings.redis_url)
    worker = Worker(
        engine,
        client,
        model=model,
        tiers=settings.tiers,
        worker_id="inproc",
        block_ms=20,
        adapter_dir=settings.adapter_store_dir,
    )
    worker.setup()
    client.zadd(f"workers:{model}", {"inproc": time.time()})
    client.hset(f"model:{model}", "max_model_len", engine.max_model_len)
    stop = threading.Event()
    threads = [
        threading.Thread(target=worker.run, args=(stop,), daemon=True),
        threading.Thread(
            target=heartbeat, args=(worker, client, stop), kwargs={"every_s": HEARTBEAT_S}, daemon=True
        ),
    ]
    for thread in threads:
        thread.start()
    try:
        yield worker, client
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=10)
        client.close()


class InProcessGateway:
    """An app with its lifespan run, an httpx client on it, and the calls tests share."""

    def __init__(self, app, http: httpx.AsyncClient) -> None:
        self.app, self.http = app, http

    @property
    def settings(self):
        return self.app.state.gateway.settings

    @property
    def model(self) -> str:
        return self.settings.model_name

    async def chat(self, key: str, **extra) -> httpx.Response:
        body = {
            "model": self.settings.model_name,
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 4,
            "ignore_eos": True,
            "temperature": 0,
            **extra,
        }
        return await self.http.post(
            "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        )

    async def complete(self, key: str, prompt, **extra) -> httpx.Response:
        body = {
            "model": self.settings.model_name,
            "prompt": prompt,
            "max_tokens": 4,
            "ignore_eos": True,
            "temperature": 0,
            **extra,
        }
        return await self.http.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"})

    async def quota_usage(self, tenant_id: int) -> dict:
        """The admin API's live quota usage of a tenant."""
        response = await self.http.get(f"/admin/tenants/{tenant_id}/quota/usage", headers=admin_headers())
        assert response.status_code == 200, response.text
        return response.json()

    def records(self, tenant_id: int) -> list:
        """The tenant's usage records of the last hour, from the database."""
        return usage_records(self.settings, tenant_id)


def usage_records(settings, tenant_id: int) -> list:
    from tenancy import list_usage, make_engine, make_session_factory

    engine = make_engine(settings.database_url)
    now = datetime.now(UTC)
    with make_session_factory(engine)() as session:
        records = list_usage(
            session, tenant_id=tenant_id, since=now - timedelta(hours=1), until=now + timedelta(minutes=1)
        )
    engine.dispose()
    return records


@contextlib.asynccontextmanager
async def inproc_gateway(settings, cls=InProcessGateway):
    """A gateway app for `settings` with its lifespan run, as `cls` (an InProcessGateway)."""
    from gateway.api.app import create_app

    app = create_app(settings)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://gateway", timeout=30
        ) as http:
            yield cls(app, http)
