"""Console page for usage: tokens and requests per hour or day, errors, SLO refusals and 429s, per
tenant and per key, over a chosen range, as charts and totals, exportable as CSV. Everything is read
from the hourly roll-ups (tenancy/usage_rollup.py) through the admin usage handlers."""

from __future__ import annotations

from datetime import timedelta

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from gateway.api.deps import StateDep
from gateway.api.routes.admin_usage import series_csv, usage_range
from gateway.api.schemas.admin import DB_ID_MAX
from gateway.console.session import SignedIn
from gateway.console.views import render
from tenancy import BUCKETS, list_api_keys, list_tenants, usage_series, usage_totals

router = APIRouter()
RANGES = {"1": "24 hours", "7": "7 days", "30": "30 days", "90": "90 days"}
TOP = 8  # owners charted one by one; the rest are summed as "others"
MAX_HOURLY_DAYS = 7  # longer ranges are charted per day: a chart (and a query) stays under ~1,500 points


def _chart(top: list, overall: list, since, until, bucket: str, names: dict) -> dict:
    """Dense series over the range: each top owner's tokens and requests, the rest as "others",
    and the errors, SLO refusals and 429s of all."""
    step, labels, at = BUCKETS[bucket], [], since.replace(hour=0) if bucket == "day" else since
    while at < until:
        labels.append(at)
        at += step
    index = {label: i for i, label in enumerate(labels)}
    empty = {"tokens": [0] * len(labels), "requests": [0] * len(labels)}
    series = {}
    for point in top:
        chart = series.setdefault(point.owner, {k: list(v) for k, v in empty.items()})
        if point.start in index:
            chart["tokens"][index[point.start]] += point.total_tokens
            chart["requests"][index[point.start]] += point.requests
    others = {k: list(v) for k, v in empty.items()}
    problems = {name: [0] * len(labels) for name in ("errors", "slo_refusals", "rate_limited")}
    for point in overall:
        i = index.get(point.start)
        if i is None:
            continue
        others["tokens"][i] += point.total_tokens - sum(s["tokens"][i] for s in series.values())
        others["requests"][i] += point.requests - sum(s["requests"][i] for s in series.values())
        for name in problems:
            problems[name][i] += getattr(point, name)
    charted = [{"label": names.get(o, str(o)), **v} for o, v in series.items()]
    if any(others["tokens"]) or any(others["requests"]):
        charted.append({"label": "others", **others})
    fmt = "%m-%d %H:00" if bucket == "hour" else "%Y-%m-%d"
    return {"labels": [label.strftime(fmt) for label in labels], "series": charted, "problems": problems}


async def _read(state, tenant_id, key_id, days, bucket):
    """The page's four queries, all on the roll-ups: totals per owner, the top owners' series, the
    series of everything in view, and the names."""
    since, until = usage_range(None, None, days=days, bucket=bucket)
    by = "key" if tenant_id is not None else "tenant"
    scope = {"since": since, "until": until, "tenant_id": tenant_id, "key_id": key_id}

    def read():
        with state.session_factory() as db:
            totals = usage_totals(db, group_by=by, bucket=bucket, **scope)
            top = sorted(totals, key=lambda o: -totals[o].total_tokens)[:TOP]
            top_points = usage_series(db, group_by=by, owners=top, bucket=bucket, **scope) if top else []
            overall = usage_series(db, bucket=bucket, **scope)
            tenants = list_tenants(db)
            keys = list_api_keys(db, tenant_id=tenant_id) if tenant_id is not None else []
            return totals, top_points, overall, tenants, keys

    totals, top_points, overall, tenants, keys = await run_in_threadpool(read)
    if by == "tenant":
        names = {t.id: t.name for t in tenants}
    else:
        names = {k.id: k.name or k.prefix for k in keys} | {0: "(no key)"}
    chart = _chart(top_points, overall, since, until, bucket, names)
    return since, until, by, tenants, keys, totals, names, chart


@router.get("/usage")
async def usage(
    request: Request,
    session: SignedIn,
    state: StateDep,
    tenant_id: int | None = Query(None, ge=1, le=DB_ID_MAX),
    key_id: int | None = Query(None, ge=1, le=DB_ID_MAX),
    days: int = Query(7, ge=1, le=400),
    bucket: str = Query("hour", pattern="^(hour|day)$"),
):
    """Usage charts and totals for every tenant, one tenant (split by key) or one key."""
    bucket = "day" if days > MAX_HOURLY_DAYS else bucket
    since, until, by, tenants, keys, totals, names, chart = await _read(
        state, tenant_id, key_id, days, bucket
    )
    query = request.url.query
    return render(
        request,
        "usage.html",
        session,
        page="usage",
        tenants=tenants,
        keys=keys,
        tenant_id=tenant_id,
        key_id=key_id,
        days=days,
        bucket=bucket,
        ranges=RANGES,
        since=since,
        until=until - timedelta(seconds=1),
        by=by,
        names=names,
        totals=totals,
        chart=chart,
        csv_query=query,
    )


@router.get("/usage.csv")
async def usage_csv(
    session: SignedIn,
    state: StateDep,
    tenant_id: int | None = Query(None, ge=1, le=DB_ID_MAX),
    key_id: int | None = Query(None, ge=1, le=DB_ID_MAX),
    days: int = Query(7, ge=1, le=400),
    bucket: str = Query("hour", pattern="^(hour|day)$"),
):
    """The usage shown on the page, one row per bucket and tenant (or key), as CSV."""
    bucket = "day" if days > MAX_HOURLY_DAYS else bucket
    since, until = usage_range(None, None, days=days, bucket=bucket)

    def read():
        with state.session_factory() as db:
            return series_csv(db, since=since, until=until, tenant_id=tenant_id, key_id=key_id, bucket=bucket)

    text = await run_in_threadpool(read)
    return Response(
        text,
        media_type="text/csv",
        headers={"content-disposition": 'attachment; filename="fairlane-usage.csv"'},
    )
