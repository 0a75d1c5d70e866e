"""The Lua scripts, assembled from ``lua/*.lua`` and registered once per Redis client.

Each script is its body prepended with the shared helpers it needs (the helpers state their
units in their headers). ``register_script`` hashes the text once and calls EVALSHA; on
NOSCRIPT (a restarted or flushed server) it loads the script again and retries, so a Redis
restart needs no gateway restart.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources

from redis.asyncio import Redis
from redis.commands.core import AsyncScript

# Script → the files it is made of, helpers first.
SOURCES = {
    "admit": ("common.lua", "state.lua", "gcra.lua", "periods.lua", "admit.lua"),
    "settle": ("common.lua", "state.lua", "gcra.lua", "settle.lua"),
    "usage": ("common.lua", "state.lua", "gcra.lua", "periods.lua", "usage.lua"),
    "renew": ("common.lua", "state.lua", "renew.lua"),
}


@cache
def source(name: str) -> str:
    """The full text of one script, as sent to SCRIPT LOAD."""
    lua = resources.files(__package__) / "lua"
    return "\n".join(lua.joinpath(part).read_text(encoding="utf-8") for part in SOURCES[name])


@dataclass(frozen=True)
class Scripts:
    """The quota scripts registered on one client (EVALSHA, reloaded on NOSCRIPT)."""

    admit: AsyncScript
    settle: AsyncScript
    usage: AsyncScript
    renew: AsyncScript

    @classmethod
    def register(cls, redis: Redis) -> Scripts:
        """Register every script on ``redis``; nothing is sent until the first call."""
        return cls(**{name: redis.register_script(source(name)) for name in SOURCES})

    async def load(self) -> None:
        """SCRIPT LOAD every script now (optional warm-up; calls load lazily anyway)."""
        for script in (self.admit, self.settle, self.usage, self.renew):
            script.sha = await script.registered_client.script_load(script.script)
