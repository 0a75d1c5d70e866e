"""Fixtures of the OpenAI routes' tests: a tenant's key on the in-process gateway."""

from __future__ import annotations

import pytest
from gateway_test_helpers import make_tenant_key


@pytest.fixture
async def key(app_client):
    _tenant, key = await make_tenant_key(app_client, "acme")
    return key
