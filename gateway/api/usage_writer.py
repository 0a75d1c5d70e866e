"""The replica's usage records, written in batches: the records of requests that end while a write
is running go in the next one, one transaction (tenancy.record_usage_batch) in a worker thread.

A write starts ``linger_s`` (the setting ``usage_write_linger_s``, 20 ms) after the first record
of its batch arrived and carries every record that ended by then or while the write before it
ran, so the database sees one transaction per batch instead of one per request, and the event loop
hands one job to the thread pool instead of one per request (at one request at a time, a write per
request cost its next request about 0.7 ms on a 2-core machine: the thread and the transaction
beside it). ``write`` returns once its record is committed, so what awaits it, a response's
background task, still finds the record in the database.

A write that fails because the database cannot be reached (a restart, a failover, a file that
cannot be opened) releases its callers at once (usage is bookkeeping, never a request's failure)
and keeps its records: they go in the next write, tried again after ``RETRY_FIRST_S``, doubling to
``RETRY_MAX_S``, with every record that ended meanwhile, up to ``MAX_PENDING`` records (the oldest
beyond that are dropped, logged). Any other failure (a record the database refuses) drops that
batch, logged, so one bad record never holds up the rest. ``aclose`` makes one last try. A writer
cancelled with records in hand (the event loop ending: records of requests cancelled when a
server's drain timed out arrive as it closes) writes them at once, blocking, before it ends: a
batch its thread may have committed meanwhile is skipped by the database (one record a request).
A replica that dies loses the records it has not written yet: one batch, or what piled up during
an outage.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from tenancy import record_usage_batch

log = logging.getLogger(__name__)

RETRY_FIRST_S, RETRY_MAX_S = 0.5, 10.0  # after a write the database was unreachable for
MAX_PENDING = 100_000  # records kept through an outage (a few hundred bytes each)


def _unreachable(exc: BaseException) -> bool:
    """The database could not be reached (worth a retry), not a record it refused."""
    if isinstance(exc, (OperationalError, InterfaceError)):
        return True
    return isinstance(exc, DBAPIError) and exc.connection_invalidated


class UsageWriter:
    """Bound to the event loop that first writes through it."""

    def __init__(self, session_factory: sessionmaker[Session], *, linger_s: float = 0.0) -> None:
        self.session_factory, self.linger_s = session_factory, linger_s
        self._rows: list[Mapping[str, Any]] = []
        self._waiting: list[asyncio.Future[None]] = []
        self._task: asyncio.Task[None] | None = None
        self._writing: list[Mapping[str, Any]] = []  # the batch in the thread now
        self._closing = asyncio.Event()  # set by aclose: the retry's wait ends, the next failure drops
        self.writes = 0  # transactions run (what a batch saves: requests recorded / writes)
        self.dropped = 0  # records given up on (refused, or beyond MAX_PENDING in an outage)

    async def write(self, row: Mapping[str, Any]) -> None:
        """Record one request's usage (the keyword arguments of tenancy.record_usage)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._rows.append(row)
        self._waiting.append(done)
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run())
        await asyncio.shield(done)  # a cancelled caller leaves its record to the write

    async def _run(self) -> None:
        try:
            await self._write_all()
        except asyncio.CancelledError:
            self._flush_now()
            raise

    async def _write_all(self) -> None:
        retry_s = RETRY_FIRST_S
        while self._rows:
            if self.linger_s:
                await asyncio.sleep(self.linger_s)
            rows, waiting = self._rows, self._waiting
            self._rows, self._waiting = [], []
            self._writing = rows
            try:
                await run_in_threadpool(self._write, rows)
                self._writing = []
                retry_s = RETRY_FIRST_S
            except Exception as exc:  # usage is bookkeeping: never fail the requests because of it
                self._writing = []
                if not _unreachable(exc) or self._closing.is_set():
                    self.dropped += len(rows)
                    log.exception("could not record the usage of %d requests", len(rows))
                    continue
                self._keep(rows)
                log.warning(
                    "could not record the usage of %d requests (%s); retrying in %.1f s",
                    len(rows),
                    type(exc).__name__,
                    retry_s,
                )
                _release(waiting)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closing.wait(), retry_s)
                retry_s = min(retry_s * 2, RETRY_MAX_S)
            finally:  # cancelled in the thread's wait: the batch stays in _writing for _flush_now
                _release(waiting)

    def _flush_now(self) -> None:
        """Write every record in hand here, blocking the loop (it is ending): the batch in the
        thread (the database skips it if the thread committed it) and those waiting their turn."""
        rows, waiting = self._writing + self._rows, self._waiting
        self._writing, self._rows, self._waiting = [], [], []
        if rows:
            try:
                self._write(rows)
                log.info("cancelled: wrote the usage of %d requests before stopping", len(rows))
            except Exception:
                self.dropped += len(rows)
                log.exception("cancelled: could not record the usage of %d requests", len(rows))
        _release(waiting)

    def _keep(self, rows: list[Mapping[str, Any]]) -> None:
        """Put a failed batch back ahead of what ended since, up to MAX_PENDING records."""
        self._rows = rows + self._rows
        over = len(self._rows) - MAX_PENDING
        if over > 0:
            del self._rows[:over]
            self.dropped += over
            log.error("usage records pile up while the database is unreachable: dropped the %d oldest", over)

    def _write(self, rows: list[Mapping[str, Any]]) -> None:
        with self.session_factory() as session:
            record_usage_batch(session, rows)
        self.writes += 1

    async def aclose(self) -> None:
        """Write what is queued (at shutdown): one more try, however the last one ended."""
        self._closing.set()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)


def _release(waiting: list[asyncio.Future[None]]) -> None:
    for done in waiting:
        if not done.done():
            done.set_result(None)
