"""Admin REST for usage over time, from the hourly roll-ups (never a scan of usage records): per
hour or per UTC day, of every tenant, one tenant or one key, as JSON or CSV."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from typing import Literal

from fastapi import APIRouter, Query
from fastapi.responses import Response
from pydantic import BaseModel

from gateway.api.deps import AdminDep, SessionDep
from gateway.api.errors import ADMIN_ERROR_RESPONSES, UnprocessableEntity
from gateway.api.schemas.admin import DB_ID_MAX, UtcDatetime
from tenancy import COUNTERS, UsagePoint, hour_of, usage_series, usage_series_rows

router = APIRouter(
    prefix="/admin", tags=["admin: keys and usage"], dependencies=[AdminDep], responses=ADMIN_ERROR_RESPONSES
)
DEFAULT_DAYS = 7
MAX_DAYS = 400  # a range longer than this is refused (a chart of ~10,000 hours)
CSV_COLUMNS = ("start", "tenant_id", "key_id", *COUNTERS, "total_tokens")
Bucket = Literal["hour", "day"]


class UsagePointPublic(BaseModel):
    start: UtcDatetime
    tenant_id: int | None
    key_id: int | None
    requests: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    errors: int
    slo_refusals: int
    rate_limited: int


class UsageSeriesPublic(BaseModel):
    since: UtcDatetime
    until: UtcDatetime
    bucket: Bucket
    data: list[UsagePointPublic]


def usage_range(
    since: datetime | None, until: datetime | None, days: int = DEFAULT_DAYS, bucket: str = "hour"
):
    """[since, until) in UTC, whole hours (``since`` a whole day per day): until defaults to the end
    of this hour."""
    until = _aware(until) or hour_of(datetime.now(UTC)) + timedelta(hours=1)
    try:
        since = hour_of(_aware(since) or until - timedelta(days=days))
    except OverflowError:
        raise UnprocessableEntity("'until' is out of range.", param="until") from None
    if bucket == "day":
        since = since.replace(hour=0)
    if since >= until:
        raise UnprocessableEntity("'since' must be before 'until'.", param="since")
    if until - since > timedelta(days=MAX_DAYS):
        raise UnprocessableEntity(f"A usage range may span at most {MAX_DAYS} days.", param="since")
    return since, until


def point_row(point: UsagePoint, *, tenant_id: int | None, key_id: int | None, by: str | None) -> dict:
    row = point.as_row()
    owner = row.pop("owner")
    row["tenant_id"] = owner if by == "tenant" else tenant_id
    row["key_id"] = owner if by == "key" else key_id
    return row


def _split(tenant_id: int | None, key_id: int | None) -> str | None:
    """How a view's rows split: one key's not at all, one tenant's by key, everything by tenant."""
    return None if key_id is not None else ("key" if tenant_id is not None else "tenant")


def series(session, *, since, until, tenant_id=None, key_id=None, bucket="hour") -> tuple[list[dict], str]:
    """Rows of usage per bucket, split by tenant (no tenant given) or by key (a tenant given)."""
    by = _split(tenant_id, key_id)
    points = usage_series(
        session, since=since, until=until, tenant_id=tenant_id, key_id=key_id, group_by=by, bucket=bucket
    )
    return [point_row(p, tenant_id=tenant_id, key_id=key_id, by=by) for p in points], by or "key"


def series_csv(session, *, since, until, tenant_id=None, key_id=None, bucket="hour") -> str:
    """``series(...)`` as CSV, written straight from the database's rows: a month of every
    tenant per day is thousands of rows, and an object per row cost more than the query."""
    by = _split(tenant_id, key_id)
    rows = usage_series_rows(
        session, since=since, until=until, tenant_id=tenant_id, key_id=key_id, group_by=by, bucket=bucket
    )
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    iso: dict[datetime, str] = {}  # one string per bucket
    prompt, completion = COUNTERS.index("prompt_tokens"), COUNTERS.index("completion_tokens")
    for start, owner, *sums in rows:
        text = iso.get(start) or iso.setdefault(start, start.isoformat())
        tenant = owner if by == "tenant" else tenant_id
        key = owner if by == "key" else key_id
        writer.writerow((text, tenant, key, *sums, sums[prompt] + sums[completion]))
    return out.getvalue()


@router.get(
    "/usage",
    response_model=UsageSeriesPublic,
    responses={200: {"content": {"text/csv": {"schema": {"type": "string"}}}}},
)
def usage_over_time(
    session: SessionDep,
    tenant_id: int | None = Query(None, ge=1, le=DB_ID_MAX),
    key_id: int | None = Query(None, ge=1, le=DB_ID_MAX),
    since: datetime | None = None,
    until: datetime | None = None,
    bucket: Bucket = "hour",
    format: Literal["json", "csv"] = "json",
):
    """Usage per hour or day in [since, until) (default: the last 7 days): requests, tokens, errors,
    SLO refusals and 429s, split by tenant, or by key of ``tenant_id``; ``format=csv`` for a file."""
    since, until = usage_range(since, until, bucket=bucket)
    if format == "csv":
        return Response(
            series_csv(session, since=since, until=until, tenant_id=tenant_id, key_id=key_id, bucket=bucket),
            media_type="text/csv",
            headers={"content-disposition": 'attachment; filename="usage.csv"'},
        )
    rows, _by = series(session, since=since, until=until, tenant_id=tenant_id, key_id=key_id, bucket=bucket)
    return UsageSeriesPublic(since=since, until=until, bucket=bucket, data=rows)


def _aware(value: datetime | None) -> datetime | None:
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value
