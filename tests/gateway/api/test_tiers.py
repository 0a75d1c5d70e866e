"""Which lane a request goes to (gateway/api/tiers.py): the tier it names or its tenant's default,
refused when the server does not serve it or the tenant may not use it."""

from __future__ import annotations

import pytest

from gateway.api.auth import AuthContext
from gateway.api.errors import InvalidRequest, PermissionDenied
from gateway.api.tiers import resolve_tier

TIERS = ["priority", "standard", "batch"]


def _auth(default_tier: str = "standard", allowed: tuple[str, ...] = ("standard", "batch")) -> AuthContext:
    return AuthContext(
        key_id=1,
        tenant_id=1,
        tenant_name="acme",
        weight=1.0,
        default_tier=default_tier,
        allowed_tiers=allowed,
        scopes=("inference",),
    )


def test_the_named_tier_or_the_tenants_default():
    assert resolve_tier(_auth(), None, TIERS) == "standard"
    assert resolve_tier(_auth(), "default", TIERS) == "standard"
    assert resolve_tier(_auth(), "batch", TIERS) == "batch"
    assert resolve_tier(_auth(), "flex", TIERS) == "batch"  # OpenAI's flex: the lowest tier


def test_refusals_name_the_field():
    with pytest.raises(InvalidRequest) as unknown:
        resolve_tier(_auth(), "platinum", TIERS)
    with pytest.raises(PermissionDenied) as not_allowed:
        resolve_tier(_auth(), "priority", TIERS)
    assert (unknown.value.code, not_allowed.value.code) == ("invalid_service_tier", "tier_not_allowed")


def test_a_default_tier_the_server_no_longer_serves_is_refused_not_queued():
    """Tenants made while the server served standard; its tiers are now gold and silver: a request
    naming no tier went to a lane no worker reads and hung until the request timeout."""
    with pytest.raises(PermissionDenied) as refused:
        resolve_tier(_auth(), None, ["gold", "silver"])
    assert refused.value.code == "tier_not_served" and refused.value.param == "service_tier"
    assert "gold, silver" in refused.value.message
