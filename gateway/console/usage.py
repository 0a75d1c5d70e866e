"""Console page for usage: tokens and requests per hour or day, errors, SLO refusals and 429s, per
tenant and per key, over a chosen range, as charts and totals, exportable as CSV. Everything is read
from the hourly roll-ups (tenancy/usage_rollup.py) through the admin usage handlers."""

from __future__ import annotations

from datetime import timedelta

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from gateway.api.deps import StateDep
from gateway.api.routes.admin_usage import csv_text, series, usage_range
from gateway.console.session import SignedIn
from gateway.console.views import render
from tenancy import BUCKETS, list_api_keys, list_tenants

router = APIRouter()
RANGES = {"1": "24 hours", "7": "7 days", "30": "30 days", "90": "90 days"}
TOP = 8  # owners charted one by one; the rest are summed as "others"


def _chart(rows: list[dict], by: str, names: dict, since, until, bucket: str) -> dict:
    step = BUCKETS[bucket]
    start = since.replace(hour=0) if bucket == "day" else since
    labels, at = [], start
    while at < until:
        labels.append(at)
        at += step
    index = {label: i for i, label in enumerate(labels)}
    owner_key = f"{by}_id"
    totals: dict = {}
    for row in rows:
        totals[row[owner_key]] = totals.get(row[owner_key], 0) + row["total_tokens"]
    top = sorted(totals, key=lambda o: -totals[o])[:TOP]
    series_of = {o: {"tokens": [0] * len(labels), "requests": [0] * len(labels)} for o in [*top, "others"]}
    problems = {name: [0] * len(labels) for name in ("errors", "slo_refusals", "rate_limited")}
    for row in rows:
        i = index.get(row["start"])
        if i is None:
            continue
        chart = series_of[row[owner_key] if row[owner_key] in top else "others"]
        chart["tokens"][i] += row["total_tokens"]
        chart["requests"][i] += row["requests"]
        for name in problems:
            problems[name][i] += row[name]
    fmt = "%m-%d %H:00" if bucket == "hour" else "%Y-%m-%d"
    return {
        "labels": [label.strftime(fmt) for label in labels],
        "series": [
            {"label": names.get(o, str(o)) if o != "others" else "others", **series_of[o]}
            for o in [*top, "others"]
            if o != "others" or any(series_of[o]["tokens"]) or any(series_of[o]["requests"])
        ],
        "problems": problems,
    }


async def _read(state, tenant_id, key_id, days, bucket):
    since, until = usage_range(None, None, days=days)

    def read():
        with state.session_factory() as db:
            tenants = list_tenants(db)
            keys = list_api_keys(db, tenant_id=tenant_id) if tenant_id is not None else []
            rows, by = series(db, since=since, until=until, tenant_id=tenant_id, key_id=key_id, bucket=bucket)
            return tenants, keys, rows, by

    tenants, keys, rows, by = await run_in_threadpool(read)
    return since, until, tenants, keys, rows, by


@router.get("/usage")
async def usage(
    request: Request,
    session: SignedIn,
    state: StateDep,
    tenant_id: int | None = Query(None, ge=1),
    key_id: int | None = Query(None, ge=1),
    days: int = Query(7, ge=1, le=400),
    bucket: str = Query("hour", pattern="^(hour|day)$"),
):
    """Usage charts and totals for every tenant, one tenant (split by key) or one key."""
    since, until, tenants, keys, rows, by = await _read(state, tenant_id, key_id, days, bucket)
    names = {t.id: t.name for t in tenants} if by == "tenant" else {k.id: k.name or k.prefix for k in keys}
    names[0] = "(no key)"
    totals: dict = {}
    for row in rows:
        total = totals.setdefault(row[f"{by}_id"], dict.fromkeys(("requests", "prompt_tokens"), 0))
        for name in (
            "requests",
            "prompt_tokens",
            "completion_tokens",
            "errors",
            "slo_refusals",
            "rate_limited",
        ):
            total[name] = total.get(name, 0) + row[name]
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
        chart=_chart(rows, by, names, since, until, bucket),
        csv_query=query,
    )


@router.get("/usage.csv")
async def usage_csv(
    session: SignedIn,
    state: StateDep,
    tenant_id: int | None = Query(None, ge=1),
    key_id: int | None = Query(None, ge=1),
    days: int = Query(7, ge=1, le=400),
    bucket: str = Query("hour", pattern="^(hour|day)$"),
):
    """The usage shown on the page, one row per bucket and tenant (or key), as CSV."""
    *_rest, rows, _by = await _read(state, tenant_id, key_id, days, bucket)
    return Response(
        csv_text(rows),
        media_type="text/csv",
        headers={"content-disposition": 'attachment; filename="fairlane-usage.csv"'},
    )
