"""Where it is stored: the Redis key of every counter, limit hash and reservation.

All keys of one tenant share the hash tag ``{tenant}``, so one Lua call may touch them all
on Redis Cluster too. A scope (the tenant, or one of its API keys) has a base name
(``KeySpace.scope``); its keys are the base plus a suffix:

| key | what |
| --- | --- |
| ``<base>:limits`` | hash of limits (``store.py``) |
| ``<base>:state`` | hash of every rate state and budget of the scope (``lua/state.lua``) |
| ``<base>:leases``, ``<base>:tier:<tier>:leases`` | sorted sets of concurrency leases |
| ``<tenant base>:res:<id>`` | one reservation's record, until settled or expired |

admit.lua, settle.lua and renew.lua get the reservation record as KEYS[1] and the scope
bases as arguments, and build the other names themselves (``lua/state.lua``, same suffixes):
every name carries the tenant's hash tag, so all are in KEYS[1]'s cluster slot. Change the
suffixes here and there together.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .limits import check_name


@lru_cache(maxsize=65536)  # on every admission: checking the names once is enough
def _scope(prefix: str, tenant: str, key: str | None) -> str:
    base = f"{prefix}:{{{check_name('tenant', tenant)}}}"
    return base if key is None else f"{base}:key:{check_name('key', key)}"


@dataclass(frozen=True)
class KeySpace:
    """Names Redis keys under one prefix (several deployments or tests may share a server)."""

    prefix: str = "fairlane:quota"

    def scope(self, tenant: str, key: str | None = None) -> str:
        """Base name of a tenant's (or a tenant's API key's) keys."""
        return _scope(self.prefix, tenant, key)

    def limits(self, tenant: str, key: str | None = None) -> str:
        """The hash holding a scope's limits (written by ``QuotaStore``, read by the Lua)."""
        return f"{self.scope(tenant, key)}:limits"

    def state(self, tenant: str, key: str | None = None) -> str:
        """The hash of a scope's rate states and budgets."""
        return f"{self.scope(tenant, key)}:state"

    def leases(self, tenant: str, key: str | None = None, tier: str | None = None) -> str:
        """The sorted set of a scope's concurrency leases (of one tier's share, if given)."""
        base = self.scope(tenant, key)
        return f"{base}:leases" if tier is None else f"{base}:tier:{check_name('tier', tier)}:leases"

    def reservation(self, tenant: str, reservation_id: str) -> str:
        """The hash recording what one admission charged, until it is settled or expires."""
        return f"{self.scope(tenant)}:res:{reservation_id}"

    def scopes(self, tenant: str, key: str | None) -> tuple[str, str]:
        """The scripts' scope arguments: the tenant's base, the key's base ('' without a key)."""
        return self.scope(tenant), "" if key is None else self.scope(tenant, key)

    def usage_keys(self, tenant: str, key: str | None = None) -> list[str]:
        """KEYS of usage.lua: one scope's limits, state and leases."""
        return [self.limits(tenant, key), self.state(tenant, key), self.leases(tenant, key)]

    def pattern(self, tenant: str | None = None) -> str:
        """A SCAN pattern for every key of one tenant, or of the whole prefix."""
        return f"{self.prefix}:*" if tenant is None else f"{self.scope(tenant)}*"
