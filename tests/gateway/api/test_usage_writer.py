"""Usage records of requests that end together are committed together, every one of them exactly
once, with an exact roll-up, even when one of a batch was recorded before."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

from sqlalchemy import event, func, select

from gateway.api.usage_writer import UsageWriter
from tenancy import create_tenant, make_engine, make_session_factory, record_usage, usage_summary
from tenancy.models import UsageRecord, utcnow

REQUESTS = 40


def _record(tenant_id: int, request_id: str | None = None) -> dict:
    return dict(
        request_id=request_id or uuid.uuid4().hex,
        tenant_id=tenant_id,
        key_id=None,
        model="m",
        tier="standard",
        prompt_tokens=10,
        completion_tokens=3,
        status="stop",
        ttft_ms=1.0,
        latency_ms=2.0,
    )


def _setup(database_url):
    engine = make_engine(database_url)
    factory = make_session_factory(engine)
    with factory() as session:
        tenant = create_tenant(session, name=f"t-{uuid.uuid4().hex[:6]}")
        session.commit()
        tenant_id = tenant.id
    commits: list[int] = []
    event.listen(engine, "commit", lambda conn: commits.append(1))
    return factory, tenant_id, commits


def _totals(factory, tenant_id: int):
    with factory() as session:
        rows = session.scalar(
            select(func.count()).select_from(UsageRecord).where(UsageRecord.tenant_id == tenant_id)
        )
        now = utcnow()
        summary = usage_summary(
            session, tenant_id=tenant_id, since=now - timedelta(days=1), until=now + timedelta(days=1)
        )
        return rows, summary.totals


async def test_records_written_at_once_share_commits_and_are_all_kept(database_url):
    factory, tenant_id, commits = _setup(database_url)
    writer = UsageWriter(factory)
    await asyncio.gather(*(writer.write(**_record(tenant_id)) for _ in range(REQUESTS)))
    rows, totals = _totals(factory, tenant_id)
    assert rows == REQUESTS
    assert (totals.requests, totals.prompt_tokens, totals.completion_tokens) == (
        REQUESTS,
        10 * REQUESTS,
        3 * REQUESTS,
    )
    assert 1 <= len(commits) < REQUESTS / 4  # group commits, not one a record


async def test_a_record_written_before_does_not_lose_the_others_of_its_batch(database_url):
    factory, tenant_id, _ = _setup(database_url)
    twice = _record(tenant_id)
    with factory() as session:
        record_usage(session, **twice)
    writer = UsageWriter(factory)
    await asyncio.gather(
        *(writer.write(**_record(tenant_id)) for _ in range(5)),
        writer.write(**twice),
        *(writer.write(**_record(tenant_id)) for _ in range(5)),
    )
    rows, totals = _totals(factory, tenant_id)
    assert rows == 11 and totals.requests == 11  # the earlier record once, the 10 others


async def test_a_lone_record_is_written_before_write_returns(database_url):
    factory, tenant_id, commits = _setup(database_url)
    writer = UsageWriter(factory)
    await writer.write(**_record(tenant_id))
    assert _totals(factory, tenant_id)[0] == 1 and len(commits) == 1
    await writer.aclose()
