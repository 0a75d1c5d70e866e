"""The gateway's one usage writer: a thread that commits the records waiting in its queue (up to
MAX_BATCH) in one transaction (tenancy.usage.record_usage_batch: a Core insert of every row and
one roll-up upsert per tenant, key and hour).

The event loop only enqueues a record with a future (``write``); the thread resolves the futures
of a batch with one wake-up of the loop once the batch is committed, so a request's background task
still ends after its record is in the database (readers of usage see every finished request).

Failures: a batch meeting a record written before (IntegrityError) is written again one record a
transaction, the duplicate skipped and the others kept; any other database error (the database
down) is retried RETRIES times with a growing pause, then the batch's futures fail (the caller logs
each record it could not write). The queue holds MAX_QUEUED records: past that ``write`` fails at
once (logged by the caller) rather than holding the gateway's memory while the database is down.
``close`` drains the queue (every record handed in is written or logged) and stops the thread.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from tenancy.usage import record_usage_batch

log = logging.getLogger(__name__)
MAX_BATCH = 512  # records a transaction at most
MAX_QUEUED = 50_000  # records waiting at most (the database down): more fail at once
RETRIES = 3  # tries of a batch after the first on a database error other than IntegrityError
RETRY_PAUSE_S = 0.2  # doubled after each

Item = tuple[dict[str, Any], asyncio.AbstractEventLoop, asyncio.Future[None]]


class UsageQueueFull(RuntimeError):
    """More records wait than MAX_QUEUED: the database does not keep up (or is down)."""


class UsageWriter:
    def __init__(self, session_factory: sessionmaker[Session], *, max_queued: int = MAX_QUEUED) -> None:
        self.session_factory = session_factory
        self._queue: queue.Queue[Item | None] = queue.Queue(max_queued)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    async def write(self, **record: Any) -> None:
        """Record one request's usage (``record_usage``'s keyword arguments); returns once committed."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        self._start()
        try:
            self._queue.put_nowait((record, loop, done))
        except queue.Full:
            raise UsageQueueFull(f"{self._queue.maxsize} usage records wait already") from None
        await asyncio.shield(done)

    async def aclose(self) -> None:
        """Write every record handed in, then stop the thread (at shutdown)."""
        await asyncio.to_thread(self.close)

    def close(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join()

    def _start(self) -> None:
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="usage-writer", daemon=True)
                    self._thread.start()

    def _run(self) -> None:
        stopping = False
        while not stopping:
            item = self._queue.get()
            batch: list[Item] = []
            while item is not None:
                batch.append(item)
                if len(batch) >= MAX_BATCH:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            stopping = item is None
            if batch:
                self._settle(batch, self._commit_retrying([record for record, _, _ in batch]))

    def _commit_retrying(self, records: list[dict[str, Any]]) -> BaseException | None:
        pause = RETRY_PAUSE_S
        for attempt in range(RETRIES + 1):
            try:
                self._commit(records)
                return None
            except Exception as exc:
                if attempt == RETRIES:
                    return exc
                log.warning("usage batch of %d failed (%s); retrying in %.1f s", len(records), exc, pause)
                time.sleep(pause)
                pause *= 2
        return None  # not reached

    def _commit(self, records: list[dict[str, Any]]) -> None:
        with self.session_factory() as session:
            try:
                record_usage_batch(session, records)
                return
            except IntegrityError:  # one of them is recorded already: each on its own, below
                session.rollback()
                if len(records) == 1:
                    return
        for record in records:
            with self.session_factory() as session:
                try:
                    record_usage_batch(session, [record])
                except IntegrityError:  # already recorded
                    session.rollback()

    @staticmethod
    def _settle(batch: list[Item], error: BaseException | None) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
        for _, loop, done in batch:
            by_loop.setdefault(loop, []).append(done)
        for loop, futures in by_loop.items():
            try:
                loop.call_soon_threadsafe(_resolve(futures, error))
            except RuntimeError:  # that loop is closed: nobody waits
                pass


def _resolve(futures: list[asyncio.Future[None]], error: BaseException | None) -> Callable[[], None]:
    def resolve() -> None:
        for done in futures:
            if not done.done():
                if error is None:
                    done.set_result(None)
                else:
                    done.set_exception(error)

    return resolve
