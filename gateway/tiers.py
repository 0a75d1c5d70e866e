"""service_tier → priority lane: the tenant's default unless the client names a tier it may use."""

from __future__ import annotations

from gateway.auth import AuthContext
from gateway.errors import InvalidRequest, PermissionDenied

# OpenAI's own values that mean "whatever my account's default is".
DEFAULT_ALIASES = frozenset({"auto", "default"})


def resolve_tier(auth: AuthContext, requested: str | None, tiers: list[str]) -> str:
    """The lane for this request; 400 for a tier that does not exist, 403 for one not allowed."""
    if requested is None or requested in DEFAULT_ALIASES:
        tier = auth.default_tier
    elif requested not in tiers:
        raise InvalidRequest(
            f"Invalid service_tier {requested!r}: choose one of {', '.join(['auto', *tiers])}.",
            param="service_tier", code="invalid_service_tier",
        )
    else:
        tier = requested
    if tier not in auth.allowed_tiers:
        raise PermissionDenied(
            f"Tenant {auth.tenant_name!r} may not use service_tier {tier!r}; "
            f"allowed tiers: {', '.join(auth.allowed_tiers)}.",
            param="service_tier", code="tier_not_allowed",
        )
    return tier
