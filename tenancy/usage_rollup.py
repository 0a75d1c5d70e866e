"""Hourly usage roll-ups (``usage_hourly``): kept as requests settle, read by the console's charts.

``add_to_rollup`` is called by ``record_usage`` in the transaction that writes the usage record, so a
roll-up never counts a request twice and never misses one that was recorded. Quota refusals (429s)
leave no usage record; gateways add them in batches with ``add_refusals``. Readers group roll-up
rows, never usage records: a chart over a month reads at most 720 rows per key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from tenancy.models import UsageHourly

ERROR_STATUS = "error"  # usage status of a request that ended in an error
SLO_STATUS = "slo_unattainable"  # usage status of a request refused for its latency target
NO_KEY = 0  # key_id of roll-ups of records without a key
COUNTERS = ("requests", "prompt_tokens", "completion_tokens", "errors", "slo_refusals", "rate_limited")
BUCKETS = {"hour": timedelta(hours=1), "day": timedelta(days=1)}


def hour_of(moment: datetime) -> datetime:
    """The UTC hour ``moment`` falls in (naive times are taken as UTC)."""
    moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    return moment.replace(minute=0, second=0, microsecond=0)


def add_to_rollup(
    session: Session, *, tenant_id: int, key_id: int | None, hour: datetime, **counts: int
) -> None:
    """Add ``counts`` (names from COUNTERS) to one roll-up row, creating it; the caller commits."""
    values = {name: int(counts.get(name, 0)) for name in COUNTERS}
    insert = pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert
    statement = insert(UsageHourly).values(
        tenant_id=tenant_id, key_id=key_id or NO_KEY, hour=hour_of(hour), **values
    )
    table = UsageHourly.__table__
    statement = statement.on_conflict_do_update(
        index_elements=["tenant_id", "key_id", "hour"],
        set_={name: table.c[name] + statement.excluded[name] for name in COUNTERS},
    )
    session.execute(statement)


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
        return {f.name: getattr(self, f.name) for f in fields(self)} | {"total_tokens": self.total_tokens}


def usage_series(
    session: Session,
    *,
    since: datetime,
    until: datetime,
    tenant_id: int | None = None,
    key_id: int | None = None,
    group_by: str | None = None,
    bucket: str = "hour",
) -> list[UsagePoint]:
    """Usage per bucket ("hour" or "day") in [since, until), of every tenant, one tenant or one key,
    split by "tenant" or "key" (``group_by``) or not; ordered by bucket, then owner."""
    if bucket not in BUCKETS:
        raise ValueError(f"bucket must be one of {sorted(BUCKETS)}")
    owner = {"tenant": UsageHourly.tenant_id, "key": UsageHourly.key_id, None: None}[group_by]
    columns = [UsageHourly.hour] + ([owner] if owner is not None else [])
    query = select(*columns, *(func.sum(getattr(UsageHourly, name)) for name in COUNTERS))
    query = query.where(UsageHourly.hour >= hour_of(since), UsageHourly.hour < until)
    if tenant_id is not None:
        query = query.where(UsageHourly.tenant_id == tenant_id)
    if key_id is not None:
        query = query.where(UsageHourly.key_id == key_id)
    query = query.group_by(*columns).order_by(*columns)
    points: dict[tuple[datetime, int | None], list[int]] = {}
    for row in session.execute(query):
        start = hour_of(row[0])
        if bucket == "day":
            start = start.replace(hour=0)
        who = row[1] if owner is not None else None
        sums = points.setdefault((start, who), [0] * len(COUNTERS))
        for i, value in enumerate(row[len(columns) :]):
            sums[i] += int(value or 0)
    return [UsagePoint(start, who, *sums) for (start, who), sums in sorted(points.items(), key=_order)]


def usage_totals(
    session: Session,
    *,
    since: datetime,
    until: datetime,
    group_by: str = "tenant",
    tenant_id: int | None = None,
) -> dict[int, UsagePoint]:
    """Totals in [since, until) per tenant or per key (of one tenant when ``tenant_id`` is given)."""
    owner = UsageHourly.tenant_id if group_by == "tenant" else UsageHourly.key_id
    query = select(owner, *(func.sum(getattr(UsageHourly, name)) for name in COUNTERS))
    query = query.where(UsageHourly.hour >= hour_of(since), UsageHourly.hour < until)
    if tenant_id is not None:
        query = query.where(UsageHourly.tenant_id == tenant_id)
    totals = {}
    for who, *sums in session.execute(query.group_by(owner)):
        totals[who] = UsagePoint(hour_of(since), who, *(int(v or 0) for v in sums))
    return totals


def _order(item):
    (start, who), _sums = item
    return start, who if who is not None else -1
