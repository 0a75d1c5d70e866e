"""The last resorts of gateway/api/errors.py: what the request path did not expect of Redis."""

from __future__ import annotations

import logging

from gateway_test_helpers import assert_openai_error, inproc_gateway

from tenancy import create_api_key, create_tenant, make_engine, make_session_factory


def _key(database_url: str) -> str:
    """A tenant's key made in the database directly (the admin API would need the broken Redis)."""
    engine = make_engine(database_url)
    with make_session_factory(engine)() as session:
        tenant = create_tenant(session, name="acme")
        key = create_api_key(session, tenant_id=tenant.id, name="k").key
    engine.dispose()
    return key


async def test_a_redis_that_refuses_its_commands_is_a_503_not_a_500(settings, caplog):
    """The machine's Redis with a database number it does not have: every command is refused with
    a ResponseError ("DB index is out of range"), which was an unmapped 500 with a traceback."""
    refused = settings.model_copy(update={"redis_url": "redis://127.0.0.1:6379/99"})
    key = _key(settings.database_url)
    async with inproc_gateway(refused) as gw:
        with caplog.at_level(logging.ERROR, logger="gateway.api.errors"):
            response = await gw.chat(key)
    error = assert_openai_error(response, 503, code="service_unavailable")
    assert error["type"] == "server_error" and response.headers["retry-after"]
    assert "Traceback" not in caplog.text and "unhandled error" not in caplog.text
    assert "Redis refused a command: DB index is out of range" in caplog.text
