"""Whether the lane entries a worker runs are still its own (gateway/worker/reclaim.lua).

The heartbeat re-claims them every beat (and the loop once more before it publishes a step that
began longer than ``worker_claim_idle_ms`` after its last publish): an entry pending for another
worker was claimed from this one while it was frozen or cut off from Redis, and the request is that
worker's now, so this one drops it without publishing anything. An entry pending for nobody was
ACKed by the worker that claimed it (the request is over: dropped too) or lost with a restarted
Redis (the request goes on without one).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from gateway.worker.reclaim import Ownership

if TYPE_CHECKING:
    from engine import Engine
    from gateway.worker.inflight import InFlight
    from gateway.worker.lane_io import LaneIO

log = logging.getLogger(__name__)


class Reclaims:
    """The Worker's side: what a re-claim found, dealt with by the loop before its next step."""

    engine: Engine
    lane_io: LaneIO
    lock: threading.Lock
    inflight: dict[str, InFlight]
    _lost: set[tuple[str, str]]  # (lane, entry id) pending for nobody
    _taken: set[tuple[str, str]]  # ... pending for another worker

    def owned_entries(self) -> dict[str, list[str]]:
        """Lane → entry ids this worker is running (the heartbeat keeps them claimed)."""
        with self.lock:
            owned: dict[str, list[str]] = {}
            for running in self.inflight.values():
                if running.entry_id is not None:
                    owned.setdefault(running.lane, []).append(running.entry_id)
            return owned

    def mark_ownership(self, ownership: Ownership) -> None:
        """Entries a re-claim found gone from the group or taken by another worker (the heartbeat's
        thread, or the loop's); the loop deals with them before its next step."""
        with self.lock:
            for lane, ids in ownership.lost.items():
                self._lost.update((lane, e) for e in ids)
            for lane, ids in ownership.taken.items():
                self._taken.update((lane, e) for e in ids)

    def _forget_lost(self) -> None:
        """Requests another worker took, or whose entry it ACKed (they ended there), are dropped
        here unpublished; those whose entries a restarted Redis lost go on without one."""
        with self.lock:
            lost, taken = set(self._lost), set(self._taken)
            gone = [rid for rid, r in self.inflight.items() if (r.lane, r.entry_id) in lost]
        # one round trip: did the request end (a result marked done, or a cancel mark)?
        priors = self.lane_io.priors([(rid, True) for rid in gone])[0] if gone else []
        ended = {rid for rid, prior in zip(gone, priors) if prior.over}
        dropped = []
        with self.lock:
            self._lost -= lost
            self._taken -= taken
            for request_id, running in self.inflight.items():
                if request_id in ended or (running.lane, running.entry_id) in taken:
                    log.warning(
                        "request %s was claimed by another worker while this one stalled; dropped here",
                        request_id,
                    )
                    dropped.append(request_id)
                elif (running.lane, running.entry_id) in lost:
                    log.warning(
                        "request %s lost its lane entry %s (Redis restarted?)", request_id, running.entry_id
                    )
                    running.entry_id = None
            for request_id in dropped:
                running = self.inflight.pop(request_id)
                if running.trace is not None:
                    running.trace.aborted()
        for request_id in dropped:
            self.engine.abort(request_id)  # frees its blocks; nothing of it is published here

    def _check_ownership(self) -> None:
        """Before publishing a step that began long after the last publish: which running entries
        are still this worker's (another may have claimed them meanwhile)."""
        owned = self.owned_entries()
        if owned:
            self.mark_ownership(self.lane_io.reclaim(owned))
            self._forget_lost()
