"""Hourly usage roll-ups (``usage_hourly``): kept as requests settle, read by the console's charts.

``add_to_rollup`` is called by ``record_usage`` in the transaction that writes the usage record, so a
roll-up never counts a request twice and never misses one that was recorded. Each request adds to
three rows: its key's in its hour (``key_id`` 0 when it had none), its tenant's total in its hour
(``key_id`` ALL_KEYS) and its tenant's total in its UTC day (ALL_KEYS_DAY), so that views of every
tenant read one row per tenant and hour (or day), and views of one tenant's keys one row per key
and hour. Quota refusals (429s) leave no usage record; gateways add them in
batches with ``add_refusals``. Readers group roll-up rows, never usage records.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping
from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from sqlalchemy import BigInteger, ColumnElement, Select, Table, func, select
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from tenancy.models import ROLLUP_COUNTERS, UsageHourly

ERROR_STATUS = "error"  # usage status of a request that ended in an error
SLO_STATUS = "slo_unattainable"  # usage status of a request refused for its latency target
NO_KEY = 0  # key_id of roll-ups of records without a key
ALL_KEYS = -1  # key_id of a tenant's total over all its keys (and none) in an hour
ALL_KEYS_DAY = -2  # key_id of a tenant's total over a UTC day, stored at the day's first hour
COUNTERS = ROLLUP_COUNTERS
BUCKETS = {"hour": timedelta(hours=1), "day": timedelta(days=1)}
GROUPS = ("tenant", "key", None)


def hour_of(moment: datetime) -> datetime:
    """The UTC hour ``moment`` falls in (naive times are taken as UTC)."""
    moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    return moment.replace(minute=0, second=0, microsecond=0)


def add_to_rollup(
    session: Session, *, tenant_id: int, key_id: int | None, hour: datetime, **counts: int
) -> None:
    """Add ``counts`` (names from COUNTERS) to the key's and the tenant's rows of an hour and the
    tenant's row of its day, creating them; the caller commits."""
    values = {name: int(counts.get(name, 0)) for name in COUNTERS}
    hour = hour_of(hour)
    rows = [
        {"tenant_id": tenant_id, "key_id": k, "hour": at, **values}
        for k, at in ((key_id or NO_KEY, hour), (ALL_KEYS, hour), (ALL_KEYS_DAY, hour.replace(hour=0)))
    ]
    session.connection().execute(_upsert(session.get_bind().dialect.name), rows)


@functools.cache
def _upsert(dialect: str) -> Any:
    """The roll-up's upsert, built once per dialect and run with each request's rows as parameters
    (a statement built per call with its rows inlined is compiled again every time: ~2 ms)."""
    insert = pg_insert if dialect == "postgresql" else sqlite_insert
    table = cast(Table, UsageHourly.__table__)
    statement = insert(table)
    return statement.on_conflict_do_update(
        index_elements=["tenant_id", "key_id", "hour"],
        set_={name: table.c[name] + statement.excluded[name] for name in COUNTERS},
    )


def add_refusals(session: Session, counts: Mapping[tuple[int, int | None, datetime], int]) -> None:
    """Add quota refusals: (tenant id, key id, hour) -> how many; one transaction."""
    for (tenant_id, key_id, hour), n in counts.items():
        add_to_rollup(session, tenant_id=tenant_id, key_id=key_id, hour=hour, rate_limited=n)
    session.commit()


@dataclass(frozen=True)
class UsagePoint:
    """Usage of one bucket (an hour or a UTC day) of one tenant or key (``owner``; None: all)."""

    start: datetime
    owner: int | None
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    errors: int = 0
    slo_refusals: int = 0
    rate_limited: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def as_row(self) -> dict:
        row = {name: getattr(self, name) for name in _POINT_FIELDS}
        row["total_tokens"] = self.prompt_tokens + self.completion_tokens
        return row


_POINT_FIELDS = tuple(f.name for f in fields(UsagePoint))  # fields() per row cost more than the query


def _scoped(
    query: Select[Any],
    *,
    since: datetime,
    until: datetime,
    tenant_id: int | None,
    key_id: int | None,
    group_by: str | None,
    owners: Collection[int] | None,
    bucket: str,
) -> Select[Any]:
    """Roll-up rows of the range for a view: by key (of one tenant, or one key) read the key rows,
    everything else the tenants' totals per hour, or per day (``bucket``; then ``since`` should be
    a day's start)."""
    if group_by not in GROUPS:
        raise ValueError(f"group_by must be one of {GROUPS}")
    if bucket not in BUCKETS:
        raise ValueError(f"bucket must be one of {sorted(BUCKETS)}")
    query = query.where(UsageHourly.hour >= hour_of(since), UsageHourly.hour < until)
    if tenant_id is not None:
        query = query.where(UsageHourly.tenant_id == tenant_id)
    if key_id is not None:
        query = query.where(UsageHourly.key_id == key_id)
    elif group_by == "key":
        query = query.where(UsageHourly.key_id >= NO_KEY)
    else:
        query = query.where(UsageHourly.key_id == (ALL_KEYS_DAY if bucket == "day" else ALL_KEYS))
    if owners is not None:
        owner = UsageHourly.key_id if group_by == "key" else UsageHourly.tenant_id
        query = query.where(owner.in_(list(owners)))
    return query


def _sums() -> list[ColumnElement[Any]]:
    # bigint sums: PostgreSQL's SUM(bigint) is numeric, which the driver returns as Decimal
    return [sql_cast(func.sum(getattr(UsageHourly, name)), BigInteger) for name in COUNTERS]


def _bucket_column(session: Session, bucket: str, *, day_rows: bool) -> Any:
    """The SQL expression of a row's bucket: its hour, or its UTC day (grouped in the database)."""
    if bucket == "hour" or day_rows:
        return UsageHourly.hour
    if session.get_bind().dialect.name == "postgresql":
        return func.date_trunc("day", func.timezone("UTC", UsageHourly.hour))
    return func.strftime("%Y-%m-%d 00:00:00", UsageHourly.hour)


def _utc(value: Any) -> datetime:
    """A bucket as the database returns it (aware, naive UTC, or SQLite's text) as an aware UTC time."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value if value.utcoffset() == timedelta(0) else value.astimezone(UTC)


def usage_series(
    session: Session,
    *,
    since: datetime,
    until: datetime,
    tenant_id: int | None = None,
    key_id: int | None = None,
    group_by: str | None = None,
    owners: Collection[int] | None = None,
    bucket: str = "hour",
) -> list[UsagePoint]:
    """Usage per bucket ("hour" or "day") in [since, until), of every tenant, one tenant or one key,
    split by "tenant" or "key" (``group_by``; only ``owners`` when given) or not; ordered by bucket,
    then owner. One row per bucket and owner comes back from the database."""
    rows = usage_series_rows(
        session,
        since=since,
        until=until,
        tenant_id=tenant_id,
        key_id=key_id,
        group_by=group_by,
        owners=owners,
        bucket=bucket,
    )
    return [UsagePoint(*row) for row in rows]


def usage_series_rows(
    session: Session,
    *,
    since: datetime,
    until: datetime,
    tenant_id: int | None = None,
    key_id: int | None = None,
    group_by: str | None = None,
    owners: Collection[int] | None = None,
    bucket: str = "hour",
) -> list[tuple[Any, ...]]:
    """``usage_series`` as plain tuples (start, owner, *COUNTERS), for readers of thousands of rows
    (a CSV of every tenant's month): no object per row."""
    owner = {"tenant": UsageHourly.tenant_id, "key": UsageHourly.key_id, None: None}.get(group_by)
    day_rows = group_by != "key" and key_id is None  # the tenants' day totals serve it
    start = _bucket_column(session, bucket, day_rows=day_rows).label("start")
    columns = [start] + ([owner] if owner is not None else [])
    # Roll-up rows are unique per (tenant, key, hour): where the view reads stored buckets of one
    # row per bucket and owner, there is nothing to add up
    stored = bucket == "hour" or day_rows
    one_row = key_id is not None or group_by == "tenant" or tenant_id is not None
    unique = stored and one_row and (group_by != "key" or tenant_id is not None)
    counters = [getattr(UsageHourly, name) for name in COUNTERS] if unique else _sums()
    query = _scoped(
        select(*columns, *counters),
        since=since,
        until=until,
        tenant_id=tenant_id,
        key_id=key_id,
        group_by=group_by,
        owners=owners,
        bucket=bucket,
    )
    query = (query if unique else query.group_by(*columns)).order_by(*columns)
    starts: dict[Any, datetime] = {}  # a bucket's value -> its UTC start: one conversion per bucket
    found = []
    for row in session.connection().execute(query):
        at = starts.get(row[0]) or starts.setdefault(row[0], _utc(row[0]))
        found.append((at, *row[1:]) if owner is not None else (at, None, *row[1:]))
    return found


def usage_totals(
    session: Session,
    *,
    since: datetime,
    until: datetime,
    group_by: str = "tenant",
    tenant_id: int | None = None,
    key_id: int | None = None,
    bucket: str = "hour",
) -> dict[int, UsagePoint]:
    """Totals in [since, until) per tenant or per key (of one tenant when ``tenant_id`` is given);
    ``bucket`` "day" reads the tenants' day totals (``since`` a day's start)."""
    owner = UsageHourly.tenant_id if group_by == "tenant" else UsageHourly.key_id
    query = _scoped(
        select(owner, *_sums()),
        since=since,
        until=until,
        tenant_id=tenant_id,
        key_id=key_id,
        group_by=group_by,
        owners=None,
        bucket=bucket,
    )
    totals = {}
    for who, *sums in session.execute(query.group_by(owner)):
        totals[who] = UsagePoint(hour_of(since), who, *(int(v or 0) for v in sums))
    return totals


def budget_use(session: Session, *, tenant_id: int, key_id: int | None, at: datetime) -> tuple[int, int]:
    """The tokens a tenant (or one of its keys: ``key_id``) was charged in the UTC day and the UTC
    month of ``at``, from the roll-ups (a usage record holds what its request was charged: the
    tokens of a request that never ran are 0): what the quotas' budgets count."""
    at = at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)
    day = at.replace(hour=0, minute=0, second=0, microsecond=0)
    month = day.replace(day=1)
    tokens = UsageHourly.prompt_tokens + UsageHourly.completion_tokens
    total = sql_cast(func.coalesce(func.sum(tokens), 0), BigInteger)

    def charged(since: datetime, key: int) -> int:
        query = select(total).where(
            UsageHourly.tenant_id == tenant_id,
            UsageHourly.key_id == key,
            UsageHourly.hour >= since,
            UsageHourly.hour <= at,
        )
        return int(session.scalar(query) or 0)

    if key_id is None:  # the tenant's day totals (one row a day), the current day among them
        return charged(day, ALL_KEYS_DAY), charged(month, ALL_KEYS_DAY)
    return charged(day, key_id), charged(month, key_id)
