"""The replica's usage records, written in batches: the records of requests that end while a write
is running go in the next one, one transaction (tenancy.record_usage_batch) in a worker thread.

A write starts ``linger_s`` (the setting ``usage_write_linger_s``, 20 ms) after the first record
of its batch arrived and carries every record that ended by then or while the write before it
ran, so the database sees one transaction per batch instead of one per request, and the event loop
hands one job to the thread pool instead of one per request (at one request at a time, a write per
request cost its next request about 0.7 ms on a 2-core machine: the thread and the transaction
beside it). A replica that dies loses at most the records of one batch. ``write`` returns once
its record is committed (or the write failed: usage is bookkeeping, never a request's failure),
so what awaits it, a response's background task, still finds the record in the database.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from tenancy import record_usage_batch

log = logging.getLogger(__name__)


class UsageWriter:
    """Bound to the event loop that first writes through it."""

    def __init__(self, session_factory: sessionmaker[Session], *, linger_s: float = 0.0) -> None:
        self.session_factory, self.linger_s = session_factory, linger_s
        self._rows: list[Mapping[str, Any]] = []
        self._waiting: list[asyncio.Future[None]] = []
        self._task: asyncio.Task[None] | None = None
        self.writes = 0  # transactions run (what a batch saves: requests recorded / writes)

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
        while self._rows:
            if self.linger_s:
                await asyncio.sleep(self.linger_s)
            rows, waiting = self._rows, self._waiting
            self._rows, self._waiting = [], []
            try:
                await run_in_threadpool(self._write, rows)
            except Exception:  # usage is bookkeeping: never fail the requests because of it
                log.exception("could not record the usage of %d requests", len(rows))
            finally:
                for done in waiting:
                    if not done.done():
                        done.set_result(None)

    def _write(self, rows: list[Mapping[str, Any]]) -> None:
        with self.session_factory() as session:
            record_usage_batch(session, rows)
        self.writes += 1

    async def aclose(self) -> None:
        """Write what is queued (at shutdown)."""
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
