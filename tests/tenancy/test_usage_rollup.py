"""Hourly roll-ups: kept by record_usage in its transaction, filled by migration 0004 from old
records, read per hour and per day, per tenant and per key, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, text
from sqlalchemy.exc import IntegrityError

from gateway.api.routes.admin_usage import series, series_csv
from tenancy import (
    UsageHourly,
    UsageRecord,
    add_refusals,
    budget_use,
    create_api_key,
    create_tenant,
    downgrade,
    hour_of,
    make_session_factory,
    record_usage,
    record_usage_batch,
    upgrade,
    usage_series,
    usage_series_rows,
    usage_totals,
)
from tenancy.usage_rollup import add_to_rollup


def _record(session, tenant_id, key_id, rid, status="stop", prompt=10, completion=5):
    return record_usage(
        session,
        request_id=rid,
        tenant_id=tenant_id,
        key_id=key_id,
        model="m",
        tier="standard",
        prompt_tokens=prompt,
        completion_tokens=completion,
        status=status,
    )


def test_record_usage_updates_its_hour_once(session):
    tenant = create_tenant(session, name="acme")
    key = create_api_key(session, tenant_id=tenant.id).api_key
    _record(session, tenant.id, key.id, "r1")
    _record(session, tenant.id, key.id, "r2", status="error", completion=0)
    _record(session, tenant.id, None, "r3", status="slo_unattainable", prompt=0, completion=0)
    with pytest.raises(IntegrityError):  # the same request again: neither row nor roll-up changes
        _record(session, tenant.id, key.id, "r1")
    session.rollback()
    add_refusals(session, {(tenant.id, key.id, datetime.now(UTC)): 3})
    rows = {r.key_id: r for r in session.scalars(select(UsageHourly))}
    assert set(rows) == {key.id, 0, -1, -2}  # the key's, no key's, the tenant's hour and day totals
    assert (rows[-1].requests, rows[-1].rate_limited, rows[-1].slo_refusals) == (3, 3, 1)
    assert (rows[-2].requests, rows[-2].prompt_tokens, hour_of(rows[-2].hour).hour) == (3, 20, 0)
    by_key = rows[key.id]
    assert (by_key.requests, by_key.prompt_tokens, by_key.completion_tokens) == (2, 20, 5)
    assert (by_key.errors, by_key.slo_refusals, by_key.rate_limited) == (1, 0, 3)
    assert (rows[0].requests, rows[0].slo_refusals) == (1, 1)
    assert hour_of(by_key.hour) == hour_of(datetime.now(UTC))


def test_budget_use_is_the_tokens_of_the_day_and_the_month_of_a_moment(session):
    """What a Redis that lost its budget counters is seeded with: a tenant's (or one key's) tokens
    in the UTC day and month of the moment, nothing before the month, after the moment or of
    another tenant."""
    tenant, other = create_tenant(session, name="budgeted"), create_tenant(session, name="other")
    key = create_api_key(session, tenant_id=tenant.id).api_key
    at = datetime(2026, 11, 29, 12, 30, tzinfo=UTC)
    for tenant_id, key_id, hour, tokens in [
        (tenant.id, key.id, datetime(2026, 11, 29, 3), 100),  # today, the key
        (tenant.id, None, datetime(2026, 11, 29, 12), 10),  # today, no key; its hour began before
        (tenant.id, key.id, datetime(2026, 11, 2, 8), 1000),  # this month
        (tenant.id, key.id, datetime(2026, 10, 31, 23), 5000),  # the month before
        (tenant.id, key.id, datetime(2026, 11, 30, 0), 7),  # after the moment
        (other.id, None, datetime(2026, 11, 29, 5), 333),
    ]:
        add_to_rollup(
            session, tenant_id=tenant_id, key_id=key_id, hour=hour, prompt_tokens=tokens, completion_tokens=1
        )
    session.commit()
    assert budget_use(session, tenant_id=tenant.id, key_id=None, at=at) == (111 + 1, 111 + 1 + 1001)
    assert budget_use(session, tenant_id=tenant.id, key_id=key.id, at=at) == (101, 101 + 1001)
    assert budget_use(session, tenant_id=other.id, key_id=key.id, at=at) == (0, 0)


def test_a_batch_is_recorded_as_its_records_one_by_one(session):
    """record_usage_batch: one transaction for many records and their roll-ups; a batch holding a
    request recorded already writes the others and skips it (as record_usage refuses it)."""
    tenant = create_tenant(session, name="batch")
    key = create_api_key(session, tenant_id=tenant.id).api_key
    statuses = ["stop", "error", "slo_unattainable"]
    rows = [
        dict(
            request_id=f"b{i}",
            tenant_id=tenant.id,
            key_id=key.id if i % 2 else None,
            model="m",
            tier="standard",
            prompt_tokens=10 + i,
            completion_tokens=i,
            status=statuses[i % 3],
            latency_ms=1.5 * i,
        )
        for i in range(7)
    ]
    assert record_usage_batch(session, rows[:4]) == 4
    assert record_usage_batch(session, rows[2:]) == 3  # b2 and b3 again: skipped
    assert record_usage_batch(session, []) == 0
    records = {r.request_id: r for r in session.scalars(select(UsageRecord))}
    assert sorted(records) == [f"b{i}" for i in range(7)]
    assert [records[f"b{i}"].latency_ms for i in range(7)] == [1.5 * i for i in range(7)]
    hourly = {r.key_id: r for r in session.scalars(select(UsageHourly))}
    for owner, mine in ((key.id, rows[1::2]), (0, rows[::2]), (-1, rows), (-2, rows)):
        got = hourly[owner]
        assert (got.requests, got.prompt_tokens, got.completion_tokens) == (
            len(mine),
            sum(r["prompt_tokens"] for r in mine),
            sum(r["completion_tokens"] for r in mine),
        )
        assert (got.errors, got.slo_refusals) == (
            sum(r["status"] == "error" for r in mine),
            sum(r["status"] == "slo_unattainable" for r in mine),
        )


def test_series_per_hour_and_day_per_tenant_and_key(session):
    a, b = create_tenant(session, name="a"), create_tenant(session, name="b")
    key = create_api_key(session, tenant_id=a.id).api_key
    day = datetime(2026, 11, 20, tzinfo=UTC)
    add_refusals(session, {(a.id, key.id, day + timedelta(hours=h)): 1 for h in (1, 2, 25)})
    add_refusals(session, {(b.id, None, day + timedelta(hours=2, minutes=30)): 4})
    since, until = day, day + timedelta(days=2)
    hourly = usage_series(session, since=since, until=until, group_by="tenant")
    assert [(p.start.hour, p.owner, p.rate_limited) for p in hourly] == [
        (1, a.id, 1),
        (2, a.id, 1),
        (2, b.id, 4),
        (1, a.id, 1),
    ]
    daily = usage_series(session, since=since, until=until, tenant_id=a.id, bucket="day")
    assert [(p.start, p.rate_limited) for p in daily] == [(day, 2), (day + timedelta(days=1), 1)]
    per_key = usage_series(session, since=since, until=day + timedelta(days=1), key_id=key.id)
    assert sum(p.rate_limited for p in per_key) == 2
    by_key = usage_series(session, since=since, until=until, tenant_id=a.id, group_by="key")
    assert {p.owner for p in by_key} == {key.id}
    only_b = usage_series(session, since=since, until=until, group_by="tenant", owners=[b.id])
    assert [(p.owner, p.rate_limited) for p in only_b] == [(b.id, 4)]
    totals = usage_totals(session, since=since, until=until)
    assert {t: p.rate_limited for t, p in totals.items()} == {a.id: 3, b.id: 4}
    keys = usage_totals(session, since=since, until=until, group_by="key", tenant_id=a.id)
    assert {k: p.rate_limited for k, p in keys.items()} == {key.id: 3}


def test_every_view_of_the_series_adds_up_the_key_rows(session):
    """Whether a view reads stored rows as they are (one per bucket and owner) or adds them up in the
    database, each bucket holds the sum of the key-level rows it covers; the CSV carries the same."""
    a, b = create_tenant(session, name="a"), create_tenant(session, name="b")
    ka, kb = (create_api_key(session, tenant_id=t.id).api_key for t in (a, b))
    day = datetime(2026, 11, 20, tzinfo=UTC)
    counts = {}
    for i, (tenant, key, h) in enumerate(
        [(a, ka, 1), (a, ka, 1), (a, None, 1), (a, ka, 30), (b, kb, 1), (b, None, 2), (b, kb, 26)]
    ):
        counts[(tenant.id, key.id if key else None, day + timedelta(hours=h, minutes=i))] = i + 1
    add_refusals(session, counts)
    since, until = day, day + timedelta(days=2)
    key_rows = session.scalars(select(UsageHourly).where(UsageHourly.key_id >= 0)).all()
    views = [
        (None, None, None),
        ("tenant", None, None),
        ("key", a.id, None),
        (None, a.id, None),
        (None, a.id, ka.id),
        (None, None, kb.id),
    ]
    for bucket in ("hour", "day"):
        for group_by, tenant_id, key_id in views:
            expected: dict[tuple, int] = {}
            for row in key_rows:
                if tenant_id is not None and row.tenant_id != tenant_id or key_id not in (None, row.key_id):
                    continue
                at = hour_of(row.hour.replace(tzinfo=UTC) if row.hour.tzinfo is None else row.hour)
                at = at.replace(hour=0) if bucket == "day" else at
                who = {"tenant": row.tenant_id, "key": row.key_id}.get(group_by)
                expected[(at, who)] = expected.get((at, who), 0) + row.rate_limited
            scope = dict(since=since, until=until, tenant_id=tenant_id, key_id=key_id, bucket=bucket)
            points = usage_series(session, group_by=group_by, **scope)
            got = {(p.start, p.owner): p.rate_limited for p in points}
            assert got == expected, (bucket, group_by, tenant_id, key_id)
            assert [(r[0], r[1]) for r in usage_series_rows(session, group_by=group_by, **scope)] == list(got)
    for tenant_id, key_id in ((None, None), (a.id, None), (a.id, ka.id)):
        scope = dict(since=since, until=until, tenant_id=tenant_id, key_id=key_id, bucket="day")
        rows, _by = series(session, **scope)
        lines = series_csv(session, **scope).splitlines()
        assert lines[0].split(",")[:3] == ["start", "tenant_id", "key_id"] and len(lines) == len(rows) + 1
        header = lines[0].split(",")
        for line, row in zip(lines[1:], rows, strict=True):
            cells = line.split(",")
            assert cells[0] == row["start"].isoformat()
            assert cells[1:] == ["" if row[c] is None else str(row[c]) for c in header[1:]]


def test_migration_0004_rolls_up_existing_records(migrated_url, db_engine):
    with make_session_factory(db_engine)() as session:
        tenant = create_tenant(session, name="old")
        for i in range(3):
            _record(session, tenant.id, None, f"old-{i}", status="error" if i == 0 else "stop")
    db_engine.dispose()
    downgrade(migrated_url, "0003")
    with db_engine.begin() as connection:  # a record written at 0003 in another hour
        connection.execute(
            text(
                "INSERT INTO usage_records (request_id, tenant_id, model, tier, prompt_tokens, "
                "completion_tokens, status, created_at) VALUES ('older', :t, 'm', 'standard', 7, 1, "
                "'stop', :at)"
            ),
            {"t": tenant.id, "at": datetime(2026, 1, 2, 3, 45, tzinfo=UTC)},
        )
    db_engine.dispose()
    upgrade(migrated_url)
    db_engine.dispose()
    with make_session_factory(db_engine)() as session:
        everything = list(session.scalars(select(UsageHourly)))
        totals = {hour_of(r.hour): r.requests for r in everything if r.key_id == -1}
        rows = sorted((r for r in everything if r.key_id >= 0), key=lambda r: hour_of(r.hour))
        days = {hour_of(r.hour): r.requests for r in everything if r.key_id == -2}
        assert [(hour_of(r.hour).hour, r.requests, r.errors) for r in rows][0] == (3, 1, 0)
        assert (rows[-1].requests, rows[-1].prompt_tokens, rows[-1].errors) == (3, 30, 1)
        assert hour_of(rows[0].hour) == datetime(2026, 1, 2, 3, tzinfo=UTC)
        assert sorted(totals.values()) == [1, 3] and sorted(days.values()) == [1, 3]
        assert datetime(2026, 1, 2, tzinfo=UTC) in days
