"""Quota refusals (429s) counted per tenant, key and hour in memory and added to the hourly usage
roll-ups in one transaction every few seconds: a storm of refusals costs the database one write per
``flush_every_s`` per replica, never one per refusal. A replica that dies loses at most that much.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from datetime import UTC, datetime

from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from tenancy import add_refusals, hour_of

log = logging.getLogger(__name__)
FLUSH_EVERY_S = 5.0


class RefusalTally:
    def __init__(
        self, session_factory: sessionmaker[Session], *, flush_every_s: float = FLUSH_EVERY_S
    ) -> None:
        self.session_factory, self.flush_every_s = session_factory, flush_every_s
        self.counts: Counter[tuple[int, int | None, datetime]] = Counter()
        self._task: asyncio.Task | None = None

    def note(self, tenant_id: int, key_id: int | None) -> None:
        """One refusal now; written within ``flush_every_s``."""
        self.counts[(tenant_id, key_id, hour_of(datetime.now(UTC)))] += 1
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._flush_later())

    async def _flush_later(self) -> None:
        while self.counts:
            await asyncio.sleep(self.flush_every_s)
            await self.flush()

    async def flush(self) -> None:
        counts, self.counts = self.counts, Counter()
        if not counts:
            return

        def write() -> None:
            with self.session_factory() as session:
                add_refusals(session, counts)

        try:
            await run_in_threadpool(write)
        except Exception:  # bookkeeping: never fail a request for it
            log.exception("could not record %d quota refusals", sum(counts.values()))

    async def aclose(self) -> None:
        """Write what is counted (at shutdown)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.flush()
