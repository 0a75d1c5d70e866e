"""Usage records and summaries, quota rows and adapter rows on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.exc import IntegrityError

from tenancy import (
    ConflictError,
    ValidationError,
    create_adapter,
    create_api_key,
    create_tenant,
    get_quota,
    list_adapters,
    list_usage,
    record_usage,
    set_quota,
    usage_summary,
)


def _record(session, tenant_id, key_id, request_id, model="smollm2", tier="standard", p=10, c=5):
    return record_usage(
        session, request_id=request_id, tenant_id=tenant_id, key_id=key_id, model=model, tier=tier,
        prompt_tokens=p, completion_tokens=c, ttft_ms=12.5, latency_ms=80.0, status="stop",
    )


def test_usage_summary_over_a_period(session):
    acme, other = create_tenant(session, name="acme"), create_tenant(session, name="other")
    key = create_api_key(session, tenant_id=acme.id).api_key
    _record(session, acme.id, key.id, "r1")
    _record(session, acme.id, key.id, "r2", tier="batch", p=7, c=3)
    _record(session, acme.id, key.id, "r3", model="dummy", p=1, c=1)
    _record(session, other.id, None, "r4", p=100, c=100)
    now = datetime.now(UTC)
    summary = usage_summary(session, tenant_id=acme.id, since=now - timedelta(hours=1), until=now + timedelta(hours=1))
    assert (summary.totals.requests, summary.totals.prompt_tokens, summary.totals.completion_tokens) == (3, 18, 9)
    assert summary.totals.total_tokens == 27
    assert summary.by_model["smollm2"].requests == 2 and summary.by_model["dummy"].prompt_tokens == 1
    assert summary.by_tier["batch"].completion_tokens == 3
    later = usage_summary(session, tenant_id=acme.id, since=now + timedelta(hours=1), until=now + timedelta(hours=2))
    assert later.totals.requests == 0 and later.by_model == {}
    rows = list_usage(session, tenant_id=acme.id, since=now - timedelta(hours=1), until=now + timedelta(hours=1))
    assert [r.request_id for r in rows] == ["r1", "r2", "r3"] and rows[0].ttft_ms == 12.5


def test_usage_is_recorded_once_per_request(session):
    acme = create_tenant(session, name="acme")
    _record(session, acme.id, None, "same")
    with pytest.raises(IntegrityError):
        _record(session, acme.id, None, "same")
    session.rollback()


def test_quota_rows_upsert_and_null_means_unlimited(session):
    acme = create_tenant(session, name="acme")
    key = create_api_key(session, tenant_id=acme.id).api_key
    assert get_quota(session, tenant_id=acme.id) is None
    set_quota(session, tenant_id=acme.id, requests_per_minute=60, tier_shares={"batch": 0.5})
    set_quota(session, tenant_id=acme.id, key_id=key.id, max_concurrency=2)
    row = set_quota(session, tenant_id=acme.id, requests_per_minute=120, allowed_tiers=["standard"])
    session.expire_all()
    tenant_row = get_quota(session, tenant_id=acme.id)
    assert tenant_row.id == row.id
    assert (tenant_row.requests_per_minute, tenant_row.tier_shares, tenant_row.tokens_per_minute) == (120, None, None)
    assert tenant_row.allowed_tiers == ["standard"]
    assert get_quota(session, tenant_id=acme.id, key_id=key.id).max_concurrency == 2
    with pytest.raises(ValidationError):
        set_quota(session, tenant_id=acme.id, bogus=1)
    with pytest.raises(ValidationError):
        set_quota(session, tenant_id=acme.id, requests_per_minute=-1)


def test_adapters_are_unique_per_tenant(session):
    acme, other = create_tenant(session, name="acme"), create_tenant(session, name="other")
    create_adapter(session, tenant_id=acme.id, name="sql", path="/a/sql", rank=8)
    create_adapter(session, tenant_id=other.id, name="sql", path="/b/sql", rank=4)
    with pytest.raises(ConflictError):
        create_adapter(session, tenant_id=acme.id, name="sql", path="/x", rank=8)
    assert [(a.name, a.rank) for a in list_adapters(session, tenant_id=acme.id)] == [("sql", 8)]
