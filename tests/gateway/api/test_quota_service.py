"""A settlement that Redis does not answer is tried again once it does: the request's concurrency
slot comes back without waiting for its lease to expire. The outage is real: the quota's own Redis
server (the embedded Valkey) stopped with SIGSTOP and resumed with SIGCONT, its data kept."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

import tenancy
from gateway.api import quota_service
from gateway.api.auth import AuthContext
from gateway.api.errors import RateLimited
from gateway.api.outcome import RequestOutcome, Status
from gateway.api.quota_service import QuotaService
from gateway.cli.embedded_redis import EmbeddedRedis


def _auth(database_url: str) -> AuthContext:
    sessions = tenancy.make_session_factory(tenancy.make_engine(database_url))
    with sessions() as s:
        tenant = tenancy.create_tenant(s, name="one-at-a-time")
        key = tenancy.create_api_key(s, tenant_id=tenant.id).api_key
        tenancy.set_quota(s, tenant_id=tenant.id, max_concurrency=1)
        return AuthContext(
            key_id=key.id,
            tenant_id=tenant.id,
            tenant_name=tenant.name,
            weight=1.0,
            default_tier="standard",
            allowed_tiers=("standard",),
            scopes=(),
        )


async def _admit(service: QuotaService, auth: AuthContext, request_id: str):
    return await service.admit(
        auth=auth, request_id=request_id, tier="standard", prompt_tokens=8, max_tokens=8
    )


async def test_a_settlement_redis_did_not_answer_frees_the_slot_once_it_does(settings, monkeypatch):
    monkeypatch.setattr(quota_service, "SETTLE_RETRY_S", 0.2)
    server = EmbeddedRedis()
    process = server.spawn()
    own = settings.model_copy(update={"redis_url": server.url})
    service = QuotaService.open(own, tenancy.make_session_factory(tenancy.make_engine(own.database_url)))
    auth = _auth(own.database_url)
    try:
        first = await _admit(service, auth, "first")
        with pytest.raises(RateLimited):  # one at a time: the slot is taken
            await _admit(service, auth, "second")
        process.send_signal(signal.SIGSTOP)  # Redis stalls: the settlement gets no answer
        try:
            await service.settle(first, RequestOutcome(Status.FINISHED, prompt_tokens=8, completion_tokens=2))
        finally:
            process.send_signal(signal.SIGCONT)
        deadline = time.monotonic() + 10
        while True:  # the slot comes back with the retried settlement, long before lease_ttl
            try:
                await _admit(service, auth, "third")
                break
            except RateLimited:
                assert time.monotonic() < deadline, "the slot was not given back"
                await asyncio.sleep(0.1)
        for _ in range(100):  # its task ends right after the settlement (done callbacks run a step later)
            if not service._retries:
                break
            await asyncio.sleep(0.01)
        assert not service._retries  # nothing left retrying
    finally:
        await service.aclose()
        process.kill()
        process.wait()
        server.remove()
