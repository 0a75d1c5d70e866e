"""A reservation settled by whoever sees the request end first: the process that publishes its
last result can settle it in the same transaction, so the concurrency slot is free by the time
the result is read (the gateway then has no settlement round trip before its response).

An admission that queues an entry (``Enqueue(settlement=True)``) adds the field ``settle`` to it:
what settle.lua needs besides the time and the tokens used, as one JSON array. The holder of the
entry settles with ``settle_call``; settle.lua is idempotent, so a settlement raced by another
(the gateway's, for a cancelled request) charges once, whichever comes first.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from .scripts import source

FIELD = "settle"  # the lane entry's field holding the settlement
SOURCE = source("settle")  # the script, for EVAL where Redis lost it (NOSCRIPT)
SHA = hashlib.sha1(SOURCE.encode()).hexdigest()  # noqa: S324 - Redis names scripts by their SHA-1


def encode(reservation_key: str, rid: str, record_ttl_ms: int, scopes: tuple[str, str], tier: str) -> str:
    """The field's value for a reservation admitted under ``rid`` (settle.lua's KEYS[1] and ARGV 3-7)."""
    return json.dumps([reservation_key, rid, record_ttl_ms, *scopes, tier], separators=(",", ":"))


def settle_call(settlement: str | bytes, used_tokens: int) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of settle.lua charging ``used_tokens`` (Redis's clock) for a field's value."""
    if used_tokens < 0:
        raise ValueError(f"used_tokens must be >= 0, got {used_tokens}")
    key, rid, ttl_ms, tenant_base, key_base, tier = json.loads(settlement)
    return [key], ["", used_tokens, rid, ttl_ms, tenant_base, key_base, tier]
