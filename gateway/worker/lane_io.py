"""The worker's lane I/O on Redis, apart from the engine: one way in (``take``: every entry the
engine has room for, a dead worker's first, then waiting ones highest tier first and, inside a
lane, the least-served tenant's first (a virtual token counter per tenant, kept in Redis and
shared by every worker: take.lua), in one script call;
``priors``: their cancel marks, in one round trip) and one way out (``publish``: results, ACKs, the
load and the cancel marks, in one MULTI/EXEC round trip, retried through a Redis outage; it and
the housekeeping of loads and consumers are ``LaneOut``, gateway/worker/lane_out.py).
"""

from __future__ import annotations

import logging
import select
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import redis as redislib
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from engine import Room
from gateway.lanes import hints
from gateway.lanes.connect import SOCKET_TIMEOUT_S
from gateway.lanes.keys import (
    GROUP,
    as_text,
    cancel_key,
    lane_backlog_key,
    lane_counters_key,
    lane_key,
    load_key,
    out_key,
    tier_priorities,
)
from gateway.lanes.messages import LaneResult
from gateway.worker.lane_out import LaneOut
from gateway.worker.reclaim import Ownership, queue_reclaim, read_reclaim

log = logging.getLogger(__name__)
TAKE_LUA = resources.files(__package__).joinpath("take.lua").read_text(encoding="utf-8")
PRUNE_EVERY_S = 60.0  # how often dead consumers and stale loads are removed
CLAIMS_PER_IDLE = 4  # look for a dead worker's entries this many times per claim_idle_ms
BLOCK_MS = 1000  # an idle worker's blocking read on its lanes lasts at most this long (< SOCKET_TIMEOUT_S)
SCAN = 1024  # new entries a take moves into a lane's backlog at most (a larger burst: the next takes)


@dataclass(frozen=True)
class LaneEntry:
    """One lane entry taken by this worker; ``claimed``: from a dead worker (it may have run)."""

    lane: str
    entry_id: str
    fields: dict[Any, Any]
    claimed: bool = False


def _fields(flat: list[Any]) -> dict[Any, Any]:
    """A stream entry's fields as a script returns them (field, value, ...), as redis-py's dict."""
    return dict(zip(flat[::2], flat[1::2]))


@dataclass(frozen=True)
class Prior:
    """What the result stream and the cancel mark say of a request before this worker runs it."""

    over: bool  # cancelled, or it ended before its worker could ACK: nothing to run
    resume_token_ids: tuple[int, ...]  # tokens a dead worker already published


class LaneIO(LaneOut):
    """The lanes of one model, as one worker reads and writes them (``worker_id``: its consumer)."""

    def __init__(
        self,
        redis: redislib.Redis,
        *,
        model: str,
        tiers: list[str],
        worker_id: str,
        result_ttl_s: int = 300,
        claim_idle_ms: int = 3000,
        block_ms: int = BLOCK_MS,
        w_in: float = 1.0,
        fair: bool = True,
    ) -> None:
        """``w_in``: the engine's VTC weight of a prompt token (EngineConfig.vtc_input_weight), which
        a take charges the tenant; ``publish`` charges its output. ``fair``: the engine's policy is
        fair between tenants (VTC); else a lane is taken in order."""
        self.redis, self.worker_id = redis, worker_id
        self.lanes = [lane_key(model, tier) for tier in tiers]  # highest tier first
        self.keys = [  # take.lua's: per lane, the stream, its backlog and its counters
            key
            for tier in tiers
            for key in (lane_key(model, tier), lane_backlog_key(model, tier), lane_counters_key(model, tier))
        ]
        self.w_in, self.fair = w_in, fair
        self.fair_keys = {  # lane -> its backlog and its counters
            lane_key(model, tier): (lane_backlog_key(model, tier), lane_counters_key(model, tier))
            for tier in tiers
        }
        self.priorities = [tier_priorities(tiers)[tier] for tier in tiers]  # the engine's, per lane
        self.load_key = load_key(model)
        self.result_ttl_s, self.claim_idle_ms, self.block_ms = result_ttl_s, claim_idle_ms, block_ms
        self.stop = threading.Event()  # set by the worker's caller: ends retries too
        self._echoes = hints.Sender()
        self._last_claim = 0.0
        self._last_prune = time.monotonic()
        self._take = redis.register_script(TAKE_LUA)  # EVALSHA, loaded again on NOSCRIPT
        # Entries wait in a backlog, as this worker's last take left them (or it does not know): the
        # blocking read on the lanes would not see them, so an idle worker takes before it blocks.
        self.backlogged = True
        self.more = True  # the lanes held more than the last wait's entries (or it does not know)

    def setup(self) -> None:
        """Create the consumer group of every lane (idempotent)."""
        self.backlogged = True
        for lane in self.lanes:
            try:
                self.redis.xgroup_create(lane, GROUP, id="0", mkstream=True)
            except redislib.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    # ---- in --------------------------------------------------------------------------------
    def take(self, room: Room) -> list[LaneEntry]:
        """The entries this worker has ``room`` for (the engine's Room of ``self.priorities``), in one
        call of take.lua: a dead worker's first (every claim_idle_ms / CLAIMS_PER_IDLE), then
        waiting ones, highest tier first, as many of a lane as ``Room.count`` allows after the
        entries taken before it, the least-served tenant's first. An urgent lane is still read
        while bulk work holds every slot or block (the engine starts its entries by displacing
        that work), and so is a lane where a tenant new to the engine's tier waits while more-served
        tenants hold more than their shares (``Room.tenants``, ``Room.fresh``: the engine starts
        its entry by displacing one of theirs)."""
        claim = self._claim_due()
        if not any(room.most(p) for p in self.priorities):
            return []
        return self._entries(self._take(keys=self.keys, args=self._take_args(room, claim)))

    def _take_args(self, room: Room, claim: bool) -> list[str | int | float]:
        args: list[str | int | float] = [GROUP, self.worker_id, int(claim), self.claim_idle_ms, room.free]
        args += [
            int(room.tiers),
            SCAN,
            self.w_in,
            int(self.fair),
            -1 if room.tokens is None else max(0, room.tokens),
        ]
        for p in self.priorities:
            held = "".join(f"{t}\n{n}\n" for t, n in sorted(room.tenants.get(p, {}).items()))
            args += [room.displacing.get(p, 0), room.fresh.get(p, 0), held]
        return args

    def _entries(self, reply: Any) -> list[LaneEntry]:
        """take.lua's reply as lane entries: the claimed ones first, then the new ones."""
        self.backlogged = bool(reply[len(self.lanes)])
        claimed: list[LaneEntry] = []
        new: list[LaneEntry] = []
        for lane, (claims, entries) in zip(self.lanes, reply[: len(self.lanes)]):
            for entry_id, flat in claims:
                log.warning("worker %s claims %s from a dead worker", self.worker_id, as_text(entry_id))
                claimed.append(LaneEntry(lane, as_text(entry_id), _fields(flat), claimed=True))
            new.extend(LaneEntry(lane, as_text(entry_id), _fields(flat)) for entry_id, flat in entries)
        return claimed + new

    def wait(
        self, inbox: hints.Inbox | None = None, on_hints: Callable[[list[bytes]], None] | None = None
    ) -> list[LaneEntry]:
        """Nothing came: block on every lane at once for an entry (one a lane at most), until the
        next look for a dead worker's entries is due (block_ms at most). An entry added meanwhile
        answers the read at once. The same round trip reads the lanes' lengths once the read
        returns: ``more`` says whether they hold anything beside the entries returned.

        With an ``inbox`` (gateway/lanes/hints.py), the datagrams that reach it while the read
        blocks go to ``on_hints`` as they come (it may run an engine step); the read's reply
        waits on its socket meanwhile."""
        left_ms = self.claim_every_s * 1000 - (time.monotonic() - self._last_claim) * 1000
        block = max(1, min(self.block_ms, int(left_ms) + 1))  # 0 would block for ever
        streams = {lane: ">" for lane in self.lanes}
        if inbox is None or on_hints is None:
            pipe = self.redis.pipeline(transaction=False)  # the lengths are read once the read returns
            pipe.xreadgroup(GROUP, self.worker_id, streams, count=1, block=block)
            for lane in self.lanes:
                pipe.xlen(lane)
            reply, *lengths = pipe.execute()
        else:
            reply, lengths = self._read_watching(block, inbox, on_hints)
        woke = [
            LaneEntry(as_text(lane), as_text(entry_id), fields)
            for lane, entries in sorted(reply or [], key=lambda r: self.lanes.index(as_text(r[0])))
            for entry_id, fields in entries
        ]
        # A lane keeps every entry until it ends (waiting, backlogged or running): a lane no longer
        # than what this read returned of it holds nothing else to take.
        self.more = any(n > sum(e.lane == lane for e in woke) for lane, n in zip(self.lanes, lengths))
        return woke

    def _read_watching(
        self, block: int, inbox: hints.Inbox, on_hints: Callable[[list[bytes]], None]
    ) -> tuple[Any, list[int]]:
        """``wait``'s read and lengths in one round trip, watching ``inbox`` until the reply is in.
        The commands go out first, so an entry added while a hint's step runs answers the read
        (and waits on the socket for the step's end)."""
        pool = self.redis.connection_pool
        conn = pool.get_connection()
        try:
            read = ["XREADGROUP", "GROUP", GROUP, self.worker_id, "COUNT", 1, "BLOCK", block, "STREAMS"]
            read += self.lanes + [">"] * len(self.lanes)
            conn.send_packed_command(conn.pack_commands([read] + [["XLEN", lane] for lane in self.lanes]))
            deadline = time.monotonic() + block / 1000 + SOCKET_TIMEOUT_S
            while not conn.can_read(timeout=0):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RedisTimeoutError("Timeout reading from socket")
                ready, _, _ = select.select([conn._sock, inbox], [], [], left)
                if inbox in ready:
                    hints = inbox.receive()
                    if hints:
                        on_hints(hints)
            reply = self.redis.parse_response(conn, "XREADGROUP")
            lengths = [self.redis.parse_response(conn, "XLEN") for _ in self.lanes]
        except BaseException:
            conn.disconnect()  # a reply may be left unread on it
            raise
        finally:
            pool.release(conn)
        return reply, lengths

    @property
    def claim_every_s(self) -> float:
        return self.claim_idle_ms / 1000 / CLAIMS_PER_IDLE

    def claim_due(self) -> bool:
        """Whether the next take looks for a dead worker's entries (and prunes when that is due)."""
        return time.monotonic() - self._last_claim >= self.claim_every_s

    def _claim_due(self) -> bool:
        now = time.monotonic()
        if now - self._last_claim < self.claim_every_s:
            return False
        self._last_claim = now
        if now - self._last_prune > PRUNE_EVERY_S:
            self._last_prune = now
            self.prune_consumers()
            self.prune_loads()
        return True

    def reclaim(self, owned: dict[str, list[str]]) -> Ownership:
        """Claim ``owned`` (lane → entry ids) again where it is still this worker's, retrying
        through an outage; which were lost or taken by another worker (gateway/worker/ownership.py)."""
        pipe = self.redis.pipeline(transaction=False)
        queue_reclaim(pipe, owned, self.worker_id)
        return read_reclaim(owned, self._execute(pipe))

    def priors(
        self, requests: Sequence[tuple[str, bool]], *, take: Room | None = None
    ) -> tuple[list[Prior], list[LaneEntry]]:
        """For each (request id, claimed): whether it was cancelled or already ended, and (claimed)
        the tokens its dead worker published, where this worker resumes it from; with ``take``, the
        new entries that room holds (as ``take``, without claims). One round trip."""
        claimed = [request_id for request_id, was_claimed in requests if was_claimed]
        taking = take is not None and any(take.most(p) for p in self.priorities)
        for attempt in range(2):
            pipe = self.redis.pipeline(transaction=False)
            for request_id in claimed:
                pipe.xrange(out_key(request_id))
            if requests:
                pipe.mget([cancel_key(request_id) for request_id, _ in requests])
            if taking:
                assert take is not None
                args = self._take_args(take, claim=False)
                pipe.evalsha(self._take.sha, len(self.keys), *self.keys, *args)
            try:
                replies = pipe.execute()
                break
            except NoScriptError:  # a restarted or flushed Redis: load the script, ask again
                if attempt:
                    raise
                self.redis.script_load(TAKE_LUA)
        entries = self._entries(replies.pop()) if taking else []
        flags = replies.pop() if requests else []
        published = dict(zip(claimed, replies))
        priors = []
        for (request_id, _), flag in zip(requests, flags):
            over, resume = flag is not None, list[int]()
            for _id, fields in published.get(request_id, []):
                result = LaneResult.decode(fields)
                over = over or result.done  # it ended before its worker could ACK
                resume.extend(result.token_ids)
            priors.append(Prior(over, tuple(resume)))
        return priors, entries
