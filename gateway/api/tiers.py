"""service_tier → priority lane: the tenant's default unless the client names a tier it may use.

OpenAI's names are accepted as names of our tiers and responses answer with them: ``priority``
is the highest tier, ``flex`` the lowest, ``default`` (in a response) any other; ``auto`` and
``default`` (in a request) mean the tenant's default tier."""

from __future__ import annotations

from gateway.api.auth import AuthContext
from gateway.api.errors import InvalidRequest, PermissionDenied

# OpenAI's own values that mean "whatever my account's default is".
DEFAULT_ALIASES = frozenset({"auto", "default"})


def openai_tier(tier: str, tiers: list[str]) -> str:
    """The service_tier a response names: OpenAI's name of our tier."""
    if tier == tiers[0]:
        return "priority"
    return "flex" if tier == tiers[-1] else "default"


def resolve_tier(auth: AuthContext, requested: str | None, tiers: list[str]) -> str:
    """The lane for this request; 400 for a tier that does not exist, 403 for one not allowed."""
    if requested == "flex" and "flex" not in tiers:
        requested = tiers[-1]
    if requested is None or requested in DEFAULT_ALIASES:
        tier = auth.default_tier
    elif requested not in tiers:
        raise InvalidRequest(
            f"Invalid service_tier {requested!r}: choose one of "
            f"{', '.join(['auto', 'default', 'flex', *tiers])}.",
            param="service_tier",
            code="invalid_service_tier",
        )
    else:
        tier = requested
    if tier not in tiers:  # the tenant's default, from before the server's tiers changed: no worker reads it
        raise PermissionDenied(
            f"Tenant {auth.tenant_name!r} defaults to service_tier {tier!r}, which this server does not "
            f"serve (its tiers: {', '.join(tiers)}): name a service_tier, or have the operator change "
            "the tenant's default tier.",
            param="service_tier",
            code="tier_not_served",
        )
    if tier not in auth.allowed_tiers:
        raise PermissionDenied(
            f"Tenant {auth.tenant_name!r} may not use service_tier {tier!r}; "
            f"allowed tiers: {', '.join(auth.allowed_tiers)}.",
            param="service_tier",
            code="tier_not_allowed",
        )
    return tier
