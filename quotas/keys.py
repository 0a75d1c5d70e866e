"""Where it is stored: the Redis key of every counter, limit hash and reservation.

All keys of one tenant share the hash tag ``{tenant}``, so one Lua call may touch them all
on Redis Cluster too. The order of ``admission_keys`` is the contract with ``lua/admit.lua``
and ``lua/settle.lua`` (KEYS[1..19]); change both together.
"""

from __future__ import annotations

from dataclasses import dataclass

from .limits import check_name

# Per scope, in KEYS order: limit hash, rate states, lease set, budgets, tier sub-buckets.
SCOPE_PARTS = ("limits", "rpm", "tpm", "leases", "day", "month", "tier_rpm", "tier_tpm", "tier_leases")
KEYS_PER_SCOPE = len(SCOPE_PARTS)  # 9: tenant scope is KEYS[1..9], key scope KEYS[10..18]


@dataclass(frozen=True)
class KeySpace:
    """Names Redis keys under one prefix (several deployments or tests may share a server)."""

    prefix: str = "fairlane:quota"

    def scope(self, tenant: str, key: str | None = None) -> str:
        """Base name of a tenant's (or a tenant's API key's) keys."""
        base = f"{self.prefix}:{{{check_name('tenant', tenant)}}}"
        return base if key is None else f"{base}:key:{check_name('key', key)}"

    def limits(self, tenant: str, key: str | None = None) -> str:
        """The hash holding a scope's limits (written by ``QuotaStore``, read by the Lua)."""
        return f"{self.scope(tenant, key)}:limits"

    def scope_keys(self, tenant: str, key: str | None, tier: str) -> list[str]:
        """The 9 keys of one scope, in ``SCOPE_PARTS`` order, tier sub-buckets for ``tier``."""
        base = self.scope(tenant, key)
        tier_base = f"{base}:tier:{check_name('tier', tier)}"
        return [f"{base}:{part}" for part in SCOPE_PARTS[:6]] + [
            f"{tier_base}:{part[5:]}" for part in SCOPE_PARTS[6:]
        ]

    def reservation(self, tenant: str, reservation_id: str) -> str:
        """The hash recording what one admission charged, until it is settled or expires."""
        return f"{self.scope(tenant)}:res:{reservation_id}"

    def admission_keys(self, tenant: str, key: str | None, tier: str, reservation_id: str) -> list[str]:
        """KEYS[1..19] of admit.lua and settle.lua: tenant scope, key scope, reservation.

        Without an API key the key scope's slots repeat the tenant's names; the scripts are
        told how many scopes to read and never touch the unused slots.
        """
        tenant_keys = self.scope_keys(tenant, None, tier)
        key_keys = self.scope_keys(tenant, key, tier) if key is not None else tenant_keys
        return tenant_keys + key_keys + [self.reservation(tenant, reservation_id)]

    def pattern(self, tenant: str | None = None) -> str:
        """A SCAN pattern for every key of one tenant, or of the whole prefix."""
        return f"{self.prefix}:*" if tenant is None else f"{self.scope(tenant)}*"
