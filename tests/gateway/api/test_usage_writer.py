"""The gateway's usage writer on SQLite and PostgreSQL: records of concurrent requests are all
written exactly once, in few transactions, with exact roll-up totals; a record written before does
not lose the others of its batch; a database error is retried; close writes what waits."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest
from sqlalchemy import event, select

from gateway.api import usage_writer
from gateway.api.usage_writer import UsageQueueFull, UsageWriter
from tenancy import (
    create_api_key,
    create_tenant,
    make_engine,
    make_session_factory,
    record_usage,
    usage_summary,
    usage_totals,
)
from tenancy.models import UsageRecord, utcnow
from tenancy.usage_rollup import hour_of

REQUESTS = 300


def _record(tenant_id: int, key_id: int | None = None, *, n: int = 0, status: str = "stop") -> dict:
    return dict(
        request_id=uuid.uuid4().hex,
        tenant_id=tenant_id,
        key_id=key_id,
        model=f"m{n % 3}",
        tier="standard",
        prompt_tokens=10 + n,
        completion_tokens=n % 7,
        status=status,
        ttft_ms=float(n),
        latency_ms=2.0 * n,
    )


@pytest.fixture
def db(database_url):
    engine = make_engine(database_url)
    factory = make_session_factory(engine)
    with factory() as session:
        tenants = [create_tenant(session, name=f"t{i}-{uuid.uuid4().hex[:6]}") for i in range(2)]
        session.commit()
        keys = [create_api_key(session, tenant_id=tenants[0].id, name="k").api_key.id, None]
        session.commit()
        ids = [t.id for t in tenants]
    commits: list[int] = []
    event.listen(engine, "commit", lambda conn: commits.append(1))
    yield factory, ids, keys, commits
    engine.dispose()


def _rows(factory) -> dict[str, tuple]:
    with factory() as session:
        found = session.execute(
            select(
                UsageRecord.request_id,
                UsageRecord.tenant_id,
                UsageRecord.key_id,
                UsageRecord.model,
                UsageRecord.prompt_tokens,
                UsageRecord.completion_tokens,
                UsageRecord.status,
                UsageRecord.ttft_ms,
                UsageRecord.latency_ms,
            )
        )
        return {row[0]: tuple(row[1:]) for row in found}


def _expected(records: list[dict]) -> dict[str, tuple]:
    names = (
        "tenant_id",
        "key_id",
        "model",
        "prompt_tokens",
        "completion_tokens",
        "status",
        "ttft_ms",
        "latency_ms",
    )
    return {r["request_id"]: tuple(r[name] for name in names) for r in records}


def _rollup(factory, group_by: str, tenant_id: int | None = None):
    now = utcnow()
    with factory() as session:
        totals = usage_totals(
            session,
            since=hour_of(now) - timedelta(hours=1),
            until=now + timedelta(hours=1),
            group_by=group_by,
            tenant_id=tenant_id,
        )
    return {
        who: (p.requests, p.prompt_tokens, p.completion_tokens, p.errors, p.slo_refusals)
        for who, p in totals.items()
    }


def _sums(records: list[dict], owner: str) -> dict:
    sums: dict = {}
    for r in records:
        s = sums.setdefault(r[owner] if r[owner] is not None else 0, [0, 0, 0, 0, 0])
        s[0] += 1
        s[1] += r["prompt_tokens"]
        s[2] += r["completion_tokens"]
        s[3] += r["status"] == "error"
        s[4] += r["status"] == "slo_unattainable"
    return {k: tuple(v) for k, v in sums.items()}


async def test_concurrent_records_are_each_written_once_with_exact_rollups(db):
    factory, tenants, keys, commits = db
    statuses = ("stop", "length", "error", "slo_unattainable")
    records = [
        _record(tenants[n % 2], keys[n % 2] if n % 2 == 0 else None, n=n, status=statuses[n % 4])
        for n in range(REQUESTS)
    ]
    writer = UsageWriter(factory)
    await asyncio.gather(*(writer.write(**r) for r in records))
    assert _rows(factory) == _expected(records)
    assert _rollup(factory, "tenant") == _sums(records, "tenant_id")
    assert _rollup(factory, "key", tenants[0]) == _sums(
        [r for r in records if r["tenant_id"] == tenants[0]], "key_id"
    )
    assert 1 <= len(commits) < REQUESTS / 4  # batches, not one transaction a record
    await writer.aclose()


async def test_a_record_written_before_does_not_lose_the_others_of_its_batch(db):
    factory, tenants, _, _ = db
    twice = _record(tenants[0])
    with factory() as session:
        record_usage(session, **twice)
    others = [_record(tenants[0], n=n) for n in range(10)]
    writer = UsageWriter(factory)
    await asyncio.gather(
        *(writer.write(**r) for r in others[:5]),
        writer.write(**twice),
        *(writer.write(**r) for r in others[5:]),
    )
    assert _rows(factory) == _expected([twice, *others])
    assert _rollup(factory, "tenant") == _sums([twice, *others], "tenant_id")  # the duplicate counted once
    await writer.aclose()


async def test_a_failing_batch_is_retried_and_then_reported(db, monkeypatch):
    factory, tenants, _, _ = db
    monkeypatch.setattr(usage_writer, "RETRY_PAUSE_S", 0.01)
    failures = [RuntimeError("database down")] * usage_writer.RETRIES
    real = usage_writer.record_usage_batch

    def flaky(session, records):
        if failures:
            raise failures.pop()
        real(session, records)

    monkeypatch.setattr(usage_writer, "record_usage_batch", flaky)
    writer = UsageWriter(factory)
    record = _record(tenants[0])
    await writer.write(**record)  # RETRIES failures, then written
    assert _rows(factory) == _expected([record])
    failures.extend([RuntimeError("database down")] * (usage_writer.RETRIES + 1))
    with pytest.raises(RuntimeError, match="database down"):
        await writer.write(**_record(tenants[0]))
    assert len(_rows(factory)) == 1
    await writer.aclose()


async def test_a_full_queue_refuses_at_once(db, monkeypatch):
    factory, tenants, _, _ = db
    writer = UsageWriter(factory, max_queued=1)
    monkeypatch.setattr(writer, "_start", lambda: None)  # no thread takes the record waiting
    loop = asyncio.get_running_loop()
    writer._queue.put_nowait((_record(tenants[0]), loop, loop.create_future()))
    with pytest.raises(UsageQueueFull):
        await writer.write(**_record(tenants[0]))
    monkeypatch.undo()
    writer.close()  # nothing to close: no thread ran


def test_close_writes_every_record_waiting(db):
    factory, tenants, _, _ = db
    records = [_record(tenants[1], n=n) for n in range(50)]
    writer = UsageWriter(factory)

    async def hand_in() -> None:
        # the records are handed in, and the loop ends before any is committed
        for r in records:
            asyncio.ensure_future(writer.write(**r))
        await asyncio.sleep(0)

    asyncio.run(hand_in())
    writer.close()
    assert _rows(factory) == _expected(records)
    now = utcnow()
    with factory() as session:
        summary = usage_summary(
            session, tenant_id=tenants[1], since=now - timedelta(days=1), until=now + timedelta(days=1)
        )
    assert summary.totals.requests == 50
