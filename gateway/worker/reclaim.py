"""The re-claim of a worker's lane entries in Redis (reclaim.lua): the calls queued on a pipeline
and their replies read as an ``Ownership``; gateway/worker/ownership.py says what the worker does
with it. Apart from ownership.py so that lane_io.py, which runs it, imports no worker mixin.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from gateway.lanes.keys import GROUP, as_text

RECLAIM_LUA = resources.files(__package__).joinpath("reclaim.lua").read_text(encoding="utf-8")


@dataclass
class Ownership:
    """Of the entries asked about, by lane: those pending for nobody and those another worker took."""

    lost: dict[str, list[str]] = field(default_factory=dict)
    taken: dict[str, list[str]] = field(default_factory=dict)


def queue_reclaim(pipe: Any, owned: dict[str, list[str]], worker_id: str) -> None:
    """One script call per lane of ``owned`` (lane → entry ids) on ``pipe``. EVAL, not EVALSHA: a
    restarted Redis has no script loaded, and a heartbeat does not stop to load one."""
    for lane, ids in owned.items():
        pipe.eval(RECLAIM_LUA, 1, lane, GROUP, worker_id, *ids)


def read_reclaim(owned: dict[str, list[str]], replies: list) -> Ownership:
    """The replies of ``queue_reclaim``'s calls (the pipeline's last ``len(owned)``), as an Ownership."""
    result = Ownership()
    for (lane, ids), (kept, taken) in zip(owned.items(), replies):
        kept_ids, taken_ids = {as_text(e) for e in kept}, [as_text(e) for e in taken]
        if taken_ids:
            result.taken[lane] = taken_ids
        lost = [e for e in ids if e not in kept_ids and e not in taken_ids]
        if lost:
            result.lost[lane] = lost
    return result
