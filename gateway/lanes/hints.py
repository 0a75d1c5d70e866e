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

The answer comes back the same way (``ResultEcho``): a hint names the gateway's own inbox, and the
worker sends the hinted request's last result there too, just before the transaction that
publishes it to Redis (gateway/worker/lane_out.py); the gateway's result reader hands the request
whichever copy comes first (gateway/lanes/result_reader.py). The Redis copy stays the record: the
reader keeps reading the stream until it shows the echoed result, and the gateway's next
admission waits for that copy (the quota's settlement rides in its transaction). Only the last
result: an echo runs ahead of the stream, and a worker that dies between an echo and its publish
leaves a stream that another worker continues from what Redis holds; an earlier result handed
from an echo could then differ from what that worker resumes from.

A hint is ``S<lane>\\n<request id>\\n<version>\\n<reply inbox>\\n<body>`` (the entry's fields as the
admission writes them; the reply inbox may be empty); a drop is ``D<request id>``; a result's echo
is ``R<request id>\\n<its position in the result stream>\\n<version>\\n<body>``.
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
START, DROP, ECHO = b"S", b"D", b"R"
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
    reply_to: str = ""  # the gateway's inbox for the request's result echoes ("": none)


@dataclass(frozen=True)
class ResultEcho:
    """A copy of one result a worker published on ``out:{request_id}``: the ``seq``-th entry (from 0)."""

    request_id: str
    seq: int
    fields: dict[bytes, bytes]  # as Redis returns the entry's fields


def start_hint(lane: str, request_id: str, fields: dict[str, str], reply_to: str = "") -> bytes:
    """The hint of one lane entry (its fields as LaneRequest.encode makes them); ``reply_to``: where
    the worker echoes the request's results ("": nowhere)."""
    head = b"%s%s\n%s\n%s\n%s\n" % (
        START,
        lane.encode(),
        request_id.encode(),
        fields["v"].encode(),
        reply_to.encode(),
    )
    return head + fields["body"].encode()


def parse_start(payload: bytes) -> StartHint | None:
    """A start hint; None for anything else."""
    if not payload.startswith(START):
        return None
    parts = payload[1:].split(b"\n", 4)
    if len(parts) != 5:
        return None
    try:
        return StartHint(parts[0].decode(), parts[1].decode(), parts[2], parts[4], parts[3].decode())
    except UnicodeDecodeError:
        return None


def result_echo(request_id: str, seq: int, fields: dict[str, str]) -> bytes:
    """The echo of a result (its fields as LaneResult.encode makes them), the ``seq``-th of its stream."""
    head = b"%s%s\n%d\n%s\n" % (ECHO, request_id.encode(), seq, fields["v"].encode())
    return head + fields["body"].encode()


def parse_echo(payload: bytes) -> ResultEcho | None:
    """A result's echo; None for anything else."""
    if not payload.startswith(ECHO):
        return None
    parts = payload[1:].split(b"\n", 3)
    if len(parts) != 4:
        return None
    try:
        return ResultEcho(parts[0].decode(), int(parts[1]), {b"v": parts[2], b"body": parts[3]})
    except (UnicodeDecodeError, ValueError):
        return None


def drop_hint(request_id: str) -> bytes:
    return DROP + request_id.encode()


def parse_drop(payload: bytes) -> str | None:
    if not payload.startswith(DROP):
        return None
    return payload[1:].decode(errors="replace")


class Inbox:
    """An inbox (a worker's, for hints; a gateway's, for result echoes): a non-blocking datagram
    socket at a fresh abstract address."""

    def __init__(self, owner: str = "worker") -> None:
        self.address = f"fairlane-{owner}-{uuid.uuid4().hex}"
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


def open_inbox(owner: str = "worker") -> Inbox | None:
    """A new inbox, or None where there cannot be one (not Linux, or the socket failed)."""
    if not supported():
        return None
    try:
        return Inbox(owner)
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
