"""The in-process gateway of the quota tests through HTTP (test_quotas_http.py and
test_quota_settlement_http.py): tenants with quotas, and a client that leaves a stream."""

from __future__ import annotations

import asyncio
import uuid

import httpx
from gateway_test_helpers import InProcessGateway, admin_headers, make_tenant_key


class QuotaGateway(InProcessGateway):
    async def tenant(self, **quota) -> tuple[dict, str, int]:
        """A new tenant (every tier allowed) with a key, and its quota if given: (tenant, key, key id)."""
        name = f"t{uuid.uuid4().hex[:8]}"
        tenant, key = await make_tenant_key(self.http, name, allowed_tiers=["priority", "standard", "batch"])
        if quota:
            response = await self.http.put(
                f"/admin/tenants/{tenant['id']}/quota", json=quota, headers=admin_headers()
            )
            assert response.status_code == 200, response.text
        keys = (await self.http.get(f"/admin/tenants/{tenant['id']}/keys", headers=admin_headers())).json()
        return tenant, key, keys["data"][0]["id"]


async def leave_a_stream(gw, key: str, prompt, max_tokens: int, *, settled, tenant_id) -> None:
    """Over a real socket: start a streamed completion, read its first line and leave; then wait
    until the server has noticed, cancelled and settled (`settled(records)` holds and nothing of
    the tenant is in flight)."""
    import uvicorn
    from serve_process import free_port

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(gw.app, port=port, lifespan="off", log_level="warning"))
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.05)
    body = {
        "model": gw.settings.model_name,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        async with client.stream(
            "POST", "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        ) as response:
            assert response.status_code == 200
            async for _line in response.aiter_lines():
                break
    for _ in range(100):
        if settled(gw.records(tenant_id)) and (await gw.quota_usage(tenant_id))["in_flight"] == 0:
            break
        await asyncio.sleep(0.1)
    server.should_exit = True
    await serving
