"""The replica's usage writer (gateway/api/usage_writer.py) on SQLite and PostgreSQL: each record is
in the database once its write returns; records of requests that end together, or within the
linger, share one transaction; a write that fails releases its callers, never raises into them,
and keeps its records while the database is unreachable until a write succeeds."""

from __future__ import annotations

import asyncio
import logging

import pytest
from sqlalchemy import func, select

from gateway.api import usage_writer
from gateway.api.usage_writer import UsageWriter
from tenancy import UsageHourly, UsageRecord, create_tenant, make_engine, make_session_factory, upgrade


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


async def test_records_wait_out_an_unreachable_database(tmp_path, caplog, monkeypatch):
    """A database that cannot be reached (here a file whose folder is not there yet) costs no record:
    the callers go on at once, and the records go in with the first write that succeeds."""
    monkeypatch.setattr(usage_writer, "RETRY_FIRST_S", 0.05)
    path = tmp_path / "later" / "fairlane.db"
    engine = make_engine(f"sqlite:///{path}")
    session_factory = make_session_factory(engine)
    writer = UsageWriter(session_factory)
    with caplog.at_level(logging.WARNING, logger="gateway.api.usage_writer"):
        await asyncio.wait_for(asyncio.gather(*(writer.write(_row(1, i)) for i in range(3))), 30)
        assert "could not record the usage of 3 requests (OperationalError); retrying" in caplog.text
        released = asyncio.create_task(writer.write(_row(1, 3)))  # ends during the outage
        await asyncio.wait_for(released, 30)
        ready = tmp_path / "ready"  # the database appears whole: its folder is renamed into place
        ready.mkdir()
        upgrade(f"sqlite:///{ready / 'fairlane.db'}")
        ready_engine = make_engine(f"sqlite:///{ready / 'fairlane.db'}")
        assert _tenant(make_session_factory(ready_engine)) == 1
        ready_engine.dispose()
        ready.rename(path.parent)
        for _ in range(300):
            if _count(session_factory)[0] == 4:
                break
            await asyncio.sleep(0.05)
    assert _count(session_factory) == (4, 4) and writer.dropped == 0
    await writer.aclose()
    engine.dispose()


async def test_a_refused_record_is_dropped_and_the_writer_goes_on(session_factory, caplog):
    """A batch that cannot be written (here a row without its status) is logged and dropped, never
    retried ahead of the records after it."""
    tenant_id, writer = _tenant(session_factory), UsageWriter(session_factory)
    with caplog.at_level(logging.ERROR, logger="gateway.api.usage_writer"):
        no_status = {k: v for k, v in _row(tenant_id, 0).items() if k != "status"}
        await asyncio.wait_for(writer.write(no_status), 30)
        assert caplog.text.count("could not record the usage of 1 requests") == 1
        await asyncio.wait_for(writer.write(_row(tenant_id, 1)), 30)
    assert _count(session_factory) == (1, 1) and writer.dropped == 1
    await writer.aclose()


@pytest.mark.parametrize(
    "unreachable",
    # a file that cannot be opened; a port nothing listens on
    ["sqlite:///{tmp}/no/such/dir.db", "postgresql+psycopg://postgres@127.0.0.1:1/test"],
    ids=["sqlite-file", "postgresql-refused"],
)
async def test_close_gives_up_on_a_database_still_unreachable(tmp_path, caplog, unreachable):
    engine = make_engine(unreachable.format(tmp=tmp_path))
    writer = UsageWriter(make_session_factory(engine))
    with caplog.at_level(logging.WARNING, logger="gateway.api.usage_writer"):
        await asyncio.wait_for(asyncio.gather(*(writer.write(_row(1, i)) for i in range(3))), 30)
        assert "retrying in 0.5 s" in caplog.text and writer.dropped == 0  # kept for the next try
        await asyncio.wait_for(writer.aclose(), 30)  # not after the retry's wait, nor never
    assert writer.dropped == 3 and "could not record the usage of 3 requests" in caplog.text
    engine.dispose()


def test_records_beyond_the_bound_are_dropped_oldest_first(monkeypatch, caplog):
    monkeypatch.setattr(usage_writer, "MAX_PENDING", 4)
    writer = UsageWriter(None)  # nothing is written here
    writer._rows = [_row(1, i) for i in (3, 4)]  # ended during the outage
    with caplog.at_level(logging.ERROR, logger="gateway.api.usage_writer"):
        writer._keep([_row(1, i) for i in (0, 1, 2)])  # the failed batch
    assert [r["request_id"] for r in writer._rows] == ["w1", "w2", "w3", "w4"]
    assert writer.dropped == 1 and "dropped the 1 oldest" in caplog.text


@pytest.mark.parametrize("linger_s", [0.0, 0.5])  # cancelled with a batch in its thread / lingering
def test_records_in_hand_when_the_loop_ends_are_written(session_factory, linger_s):
    """The event loop ends (asyncio.run cancels what is left) with records the writer holds: those
    of requests cancelled when serve's drain timed out, which settle as the app closes. They were
    lost to the CancelledError; the writer now writes them before it ends."""
    tenant_id = _tenant(session_factory)

    async def main() -> UsageWriter:
        writer = UsageWriter(session_factory, linger_s=linger_s)
        for i in range(5):
            asyncio.get_running_loop().create_task(writer.write(_row(tenant_id, i)))
        await asyncio.sleep(0.01)  # the writes queued and the writer started: the loop ends here
        return writer

    writer = asyncio.run(main())
    assert _count(session_factory) == (5, 5) and writer.dropped == 0
