"""Usage records (one per request) and their per-tenant summaries over a period.

``record_usage`` writes one usage record and ``record_usage_batch`` many; each updates the hourly
roll-up (tenancy/usage_rollup.py) in the same transaction as its records.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Table, func, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from tenancy.models import UsageRecord, utcnow
from tenancy.usage_rollup import ERROR_STATUS, SLO_STATUS, add_to_rollup


@dataclass(frozen=True)
class UsageTotals:
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class UsageSummary:
    """Totals for one tenant in [since, until), and the same split by model and by tier."""

    tenant_id: int
    since: datetime
    until: datetime
    totals: UsageTotals
    by_model: dict[str, UsageTotals] = field(default_factory=dict)
    by_tier: dict[str, UsageTotals] = field(default_factory=dict)


def record_usage(
    session: Session,
    *,
    request_id: str,
    tenant_id: int,
    key_id: int | None,
    model: str,
    tier: str,
    prompt_tokens: int,
    completion_tokens: int,
    status: str,
    ttft_ms: float | None = None,
    latency_ms: float | None = None,
) -> UsageRecord:
    record = UsageRecord(
        request_id=request_id,
        tenant_id=tenant_id,
        key_id=key_id,
        model=model,
        tier=tier,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        ttft_ms=ttft_ms,
        latency_ms=latency_ms,
        status=status,
        created_at=utcnow(),
    )
    session.add(record)
    session.flush()  # a second record of the request fails here (IntegrityError), before the roll-up
    counts = _rollup_counts(prompt_tokens, completion_tokens, status)
    add_to_rollup(session, tenant_id=tenant_id, key_id=key_id, hour=record.created_at, **counts)
    session.commit()
    return record


def _rollup_counts(prompt_tokens: int, completion_tokens: int, status: str) -> Counter[str]:
    """What one request adds to its roll-up rows."""
    return Counter(
        requests=1,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        errors=int(status == ERROR_STATUS),
        slo_refusals=int(status == SLO_STATUS),
    )


def record_usage_batch(session: Session, rows: list[Mapping[str, Any]]) -> int:
    """Usage records of many requests (each row the keyword arguments of ``record_usage``) and
    their roll-ups, in one transaction: one multi-row insert, one upsert per tenant, key and hour.
    Where one of them was recorded already, each is written on its own as ``record_usage`` does
    and that one is skipped. Returns how many records were written."""
    if not rows:
        return 0
    now = utcnow()
    values = [{"ttft_ms": None, "latency_ms": None, **row, "created_at": now} for row in rows]
    try:  # the table's insert, not the ORM's bulk insert: the same rows, a quarter less CPU a batch
        session.execute(insert(cast(Table, UsageRecord.__table__)), values)
    except IntegrityError:  # a request recorded twice: one by one, skipping it
        session.rollback()
        written = 0
        for row in rows:
            try:
                record_usage(session, **row)
                written += 1
            except IntegrityError:
                session.rollback()
        return written
    counts: dict[tuple[int, int | None], Counter[str]] = {}
    for v in values:
        c = counts.setdefault((v["tenant_id"], v["key_id"]), Counter())
        c.update(_rollup_counts(v["prompt_tokens"], v["completion_tokens"], v["status"]))
    for (tenant_id, key_id), c in counts.items():
        add_to_rollup(session, tenant_id=tenant_id, key_id=key_id, hour=now, **c)
    session.commit()
    return len(values)


def list_usage(session: Session, *, tenant_id: int, since: datetime, until: datetime) -> list[UsageRecord]:
    query = (
        select(UsageRecord)
        .where(
            UsageRecord.tenant_id == tenant_id,
            UsageRecord.created_at >= since,
            UsageRecord.created_at < until,
        )
        .order_by(UsageRecord.created_at, UsageRecord.id)
    )
    return list(session.scalars(query))


def usage_summary(session: Session, *, tenant_id: int, since: datetime, until: datetime) -> UsageSummary:
    def grouped(column: Any) -> Any:
        query = (
            select(
                column,
                func.count(UsageRecord.id),
                func.coalesce(func.sum(UsageRecord.prompt_tokens), 0),
                func.coalesce(func.sum(UsageRecord.completion_tokens), 0),
            )
            .where(
                UsageRecord.tenant_id == tenant_id,
                UsageRecord.created_at >= since,
                UsageRecord.created_at < until,
            )
            .group_by(column)
        )
        return {key: UsageTotals(int(n), int(p), int(c)) for key, n, p, c in session.execute(query)}

    by_model = grouped(UsageRecord.model)
    totals = UsageTotals(
        requests=sum(t.requests for t in by_model.values()),
        prompt_tokens=sum(t.prompt_tokens for t in by_model.values()),
        completion_tokens=sum(t.completion_tokens for t in by_model.values()),
    )
    return UsageSummary(
        tenant_id=tenant_id,
        since=since,
        until=until,
        totals=totals,
        by_model=by_model,
        by_tier=grouped(UsageRecord.tier),
    )
