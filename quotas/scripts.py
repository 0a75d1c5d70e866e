"""The Lua scripts, assembled from ``lua/*.lua`` and registered once per Redis client.

Each script is its body prepended with the shared helpers it needs (the helpers state their
units in their headers). ``register_script`` hashes the text once and calls EVALSHA; on
NOSCRIPT (a restarted or flushed server) it loads the script again and retries, so a Redis
restart needs no gateway restart.

The calls on every request's path (admit, settle, renew) go over a ``RespConnection``
(quotas/resp.py), redis-py's contract at a fraction of its cost per call; the usage report, an
operator's call, and the budgets' seed after a Redis restart stay on redis-py. A TLS client keeps
redis-py for all of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources

from redis.asyncio import Redis
from redis.commands.core import AsyncScript

from .resp import RespConnection, RespScript

# Script → the files it is made of, helpers first.
SOURCES = {
    "admit": ("common.lua", "state.lua", "gcra.lua", "periods.lua", "admit.lua"),
    "settle": ("common.lua", "state.lua", "gcra.lua", "settle.lua"),
    "usage": ("common.lua", "state.lua", "gcra.lua", "periods.lua", "usage.lua"),
    "renew": ("common.lua", "state.lua", "renew.lua"),
    "seed": ("common.lua", "state.lua", "periods.lua", "seed.lua"),
}


@cache
def source(name: str) -> str:
    """The full text of one script, as sent to SCRIPT LOAD."""
    lua = resources.files(__package__) / "lua"
    return "\n".join(lua.joinpath(part).read_text(encoding="utf-8") for part in SOURCES[name])


@dataclass(frozen=True)
class Scripts:
    """The quota scripts registered on one client (EVALSHA, reloaded on NOSCRIPT)."""

    admit: AsyncScript | RespScript
    settle: AsyncScript | RespScript
    usage: AsyncScript
    renew: AsyncScript | RespScript
    seed: AsyncScript  # budgets' use from the database, after Redis lost it (rare: redis-py)
    connection: RespConnection | None = None  # the lean connection of admit, settle and renew

    @classmethod
    def register(cls, redis: Redis) -> Scripts:
        """Register every script on ``redis``; nothing is sent until the first call."""
        lean = RespConnection.for_client(redis)
        if lean is None:
            scripts = {name: redis.register_script(source(name)) for name in SOURCES}
            return cls(**scripts)  # type: ignore[arg-type]
        hot = {name: RespScript(lean, source(name)) for name in ("admit", "settle", "renew")}
        return cls(
            **hot,
            usage=redis.register_script(source("usage")),
            seed=redis.register_script(source("seed")),
            connection=lean,
        )

    async def load(self) -> None:
        """SCRIPT LOAD every script now (optional warm-up; calls load lazily anyway)."""
        for script in (self.admit, self.settle, self.usage, self.renew, self.seed):
            if isinstance(script, RespScript):
                await script.connection.execute("SCRIPT", "LOAD", script.script)
            else:
                script.sha = await script.registered_client.script_load(script.script)

    async def aclose(self) -> None:
        """Close the lean connection (the redis-py client is its owner's to close)."""
        if self.connection is not None:
            await self.connection.aclose()
