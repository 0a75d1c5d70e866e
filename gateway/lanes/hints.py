"""Early-start hints: a gateway on the worker's own host hands it a copy of a lane entry over a local
datagram socket just before the quota admission writes the entry to Redis.

An idle worker waits in one blocking read on its lanes (gateway/worker/lane_io.py). Between the
admission's bytes leaving the gateway and that read returning, Redis runs the admission script,
serves the read, and the worker wakes: about half a millisecond on a small shared host. With a
hint the worker starts the request's first engine step at once instead, and publishes nothing of
it until the entry itself reaches it through Redis, byte for byte the same (gateway/worker/loop.py):
Redis stays the one record of what was admitted, taken and answered. A hint whose entry does not
come (the admission refused it, another worker took it, or the gateway sends a drop) costs one
step, which is then aborted; nothing of it is published or charged.

Only Linux: the inbox is a name in the abstract Unix socket namespace (nothing on disk; it goes
with the process), which a gateway on another host, or in another network namespace, cannot
reach: its sends fail and it stops trying that address for a while. Datagrams are never waited
for: a full inbox or a missing worker drops the hint, and the request takes the usual way.

A hint is ``S<lane>\\n<request id>\\n<version>\\n<body>`` (the entry's fields as the admission
writes them); a drop is ``D<request id>``.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import socket
import sys
import time
import uuid
from dataclasses import dataclass

log = logging.getLogger(__name__)

MAX_HINT_BYTES = 60_000  # a larger entry (a long prompt) goes the usual way only
# Only a short prompt is hinted: the head start (a fraction of a millisecond) matters beside a short
# step only, and the step a hint whose entry does not come wastes (a refused request's) stays short.
MAX_PROMPT_TOKENS = 256
HOLD_AFTER_REFUSAL_S = 1.0  # a tenant refused at admission is not hinted for this long (or its retry-after)
UNREACHABLE_S = 5.0  # an address that refused a datagram is not tried again for this long
START, DROP = b"S", b"D"
# Datagrams the kernel may queue for an inbox before it drops new ones (a busy worker reads none).
INBOX_BYTES = 1 << 20


def supported() -> bool:
    return sys.platform.startswith("linux")


@dataclass(frozen=True)
class StartHint:
    lane: str
    request_id: str
    version: bytes  # the entry's fields, as Redis will return them
    body: bytes


def start_hint(lane: str, request_id: str, fields: dict[str, str]) -> bytes:
    """The hint of one lane entry (its fields as LaneRequest.encode makes them)."""
    head = b"%s%s\n%s\n%s\n" % (START, lane.encode(), request_id.encode(), fields["v"].encode())
    return head + fields["body"].encode()


def parse_start(payload: bytes) -> StartHint | None:
    """A start hint; None for anything else."""
    if not payload.startswith(START):
        return None
    parts = payload[1:].split(b"\n", 3)
    if len(parts) != 4:
        return None
    try:
        return StartHint(parts[0].decode(), parts[1].decode(), parts[2], parts[3])
    except UnicodeDecodeError:
        return None


def drop_hint(request_id: str) -> bytes:
    return DROP + request_id.encode()


def parse_drop(payload: bytes) -> str | None:
    if not payload.startswith(DROP):
        return None
    return payload[1:].decode(errors="replace")


class Inbox:
    """A worker's inbox: a non-blocking datagram socket at a fresh abstract address."""

    def __init__(self) -> None:
        self.address = f"fairlane-worker-{uuid.uuid4().hex}"
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, INBOX_BYTES)
            self._sock.bind("\0" + self.address)
        except OSError:
            self._sock.close()
            raise
        self._sock.setblocking(False)

    def fileno(self) -> int:
        return self._sock.fileno()

    def receive(self) -> list[bytes]:
        """Every datagram waiting now (none: an empty list)."""
        got = []
        while True:
            try:
                got.append(self._sock.recv(MAX_HINT_BYTES + 1024))
            except (BlockingIOError, InterruptedError):
                return got

    def close(self) -> None:
        self._sock.close()


def open_inbox() -> Inbox | None:
    """A new inbox, or None where there cannot be one (not Linux, or the socket failed)."""
    if not supported():
        return None
    try:
        return Inbox()
    except OSError as exc:
        log.warning("no early-start inbox: %s", exc)
        return None


class Sender:
    """A gateway's side: one unbound datagram socket; sends never block and never raise."""

    def __init__(self) -> None:
        self._sock: socket.socket | None = None
        self._unreachable: dict[str, float] = {}  # address -> monotonic time it may be tried again

    def send(self, address: str, payload: bytes) -> bool:
        """Whether the datagram was queued for ``address``'s inbox."""
        if len(payload) > MAX_HINT_BYTES or not supported():
            return False
        until = self._unreachable.get(address)
        if until is not None:
            if time.monotonic() < until:
                return False
            del self._unreachable[address]
        if self._sock is None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sock.setblocking(False)
        try:
            self._sock.sendto(payload, "\0" + address)
            return True
        except OSError as exc:  # EAGAIN: the inbox is full (its worker is busy): only this one is dropped
            if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                self._unreachable[address] = time.monotonic() + UNREACHABLE_S
            return False

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None
