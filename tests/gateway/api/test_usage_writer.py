"""The replica's usage writer (gateway/api/usage_writer.py) on SQLite and PostgreSQL: each record is
in the database once its write returns; records of requests that end together, or within the
linger, share one transaction; a write that fails is logged and releases its callers, never
raises into them."""

from __future__ import annotations

import asyncio
import logging

import pytest
from sqlalchemy import func, select

from gateway.api.usage_writer import UsageWriter
from tenancy import UsageHourly, UsageRecord, create_tenant, make_engine, make_session_factory


@pytest.fixture
def session_factory(sql_database_url):
    engine = make_engine(sql_database_url)
    yield make_session_factory(engine)
    engine.dispose()


def _row(tenant_id: int, i: int) -> dict:
    return dict(
        request_id=f"w{i}",
        tenant_id=tenant_id,
        key_id=None,
        model="m",
        tier="standard",
        prompt_tokens=3,
        completion_tokens=i,
        status="stop",
    )


def _tenant(session_factory) -> int:
    with session_factory() as session:
        return create_tenant(session, name="writer").id


def _count(session_factory) -> tuple[int, int | None]:
    with session_factory() as session:
        records = session.scalar(select(func.count()).select_from(UsageRecord))
        total = session.scalar(select(UsageHourly.requests).where(UsageHourly.key_id == -1))
    return records, total


async def test_each_record_is_written_when_its_write_returns(session_factory):
    tenant_id, writer = _tenant(session_factory), UsageWriter(session_factory)
    for i in range(3):
        await writer.write(_row(tenant_id, i))
        assert _count(session_factory) == (i + 1, i + 1)
    assert writer.writes == 3  # one at a time: nothing to batch
    await writer.write(_row(tenant_id, 0))  # recorded already: skipped, nothing raised
    assert _count(session_factory) == (3, 3)
    await writer.aclose()


async def test_records_that_end_together_share_a_transaction(session_factory):
    tenant_id, writer = _tenant(session_factory), UsageWriter(session_factory)
    await asyncio.gather(*(writer.write(_row(tenant_id, i)) for i in range(40)))
    assert _count(session_factory) == (40, 40)
    assert writer.writes <= 2  # the first write, then every record queued while it ran
    await writer.aclose()


async def test_records_within_the_linger_share_a_transaction(session_factory):
    """usage_write_linger_s: requests that end one after another within it share one write."""
    tenant_id, writer = _tenant(session_factory), UsageWriter(session_factory, linger_s=0.2)
    tasks = []
    for i in range(5):
        tasks.append(asyncio.create_task(writer.write(_row(tenant_id, i))))
        await asyncio.sleep(0.01)
    assert _count(session_factory) == (0, None)  # still lingering
    await asyncio.gather(*tasks)
    assert _count(session_factory) == (5, 5) and writer.writes == 1
    await writer.aclose()


async def test_a_failed_write_is_logged_and_releases_its_callers(tmp_path, caplog):
    engine = make_engine(f"sqlite:///{tmp_path / 'no' / 'such' / 'dir.db'}")  # cannot be opened
    writer = UsageWriter(make_session_factory(engine))
    with caplog.at_level(logging.ERROR, logger="gateway.api.usage_writer"):
        await asyncio.wait_for(asyncio.gather(*(writer.write(_row(1, i)) for i in range(3))), 30)
        assert caplog.text.count("could not record the usage of") == 1  # one batch, one failure
        await asyncio.wait_for(writer.write(_row(1, 3)), 30)  # the writer goes on
    assert caplog.text.count("could not record the usage of") == 2
    await writer.aclose()
    engine.dispose()
