"""Usage records and summaries, quota rows and adapter rows on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.exc import IntegrityError

from tenancy import (
    ConflictError,
    NotFoundError,
    ValidationError,
    create_adapter,
    create_api_key,
    create_tenant,
    delete_adapter,
    digest_in_use,
    get_adapter_by_id,
    get_quota,
    list_adapters,
    list_usage,
    record_usage,
    set_quota,
    usage_summary,
)


def _record(session, tenant_id, key_id, request_id, model="smollm2", tier="standard", p=10, c=5):
    return record_usage(
        session,
        request_id=request_id,
        tenant_id=tenant_id,
        key_id=key_id,
        model=model,
        tier=tier,
        prompt_tokens=p,
        completion_tokens=c,
        ttft_ms=12.5,
        latency_ms=80.0,
        status="stop",
    )


def test_usage_summary_over_a_period(session):
    acme, other = create_tenant(session, name="acme"), create_tenant(session, name="other")
    key = create_api_key(session, tenant_id=acme.id).api_key
    _record(session, acme.id, key.id, "r1")
    _record(session, acme.id, key.id, "r2", tier="batch", p=7, c=3)
    _record(session, acme.id, key.id, "r3", model="dummy", p=1, c=1)
    _record(session, other.id, None, "r4", p=100, c=100)
    now = datetime.now(UTC)
    summary = usage_summary(
        session, tenant_id=acme.id, since=now - timedelta(hours=1), until=now + timedelta(hours=1)
    )
    assert (summary.totals.requests, summary.totals.prompt_tokens, summary.totals.completion_tokens) == (
        3,
        18,
        9,
    )
    assert summary.totals.total_tokens == 27
    assert summary.by_model["smollm2"].requests == 2 and summary.by_model["dummy"].prompt_tokens == 1
    assert summary.by_tier["batch"].completion_tokens == 3
    later = usage_summary(
        session, tenant_id=acme.id, since=now + timedelta(hours=1), until=now + timedelta(hours=2)
    )
    assert later.totals.requests == 0 and later.by_model == {}
    rows = list_usage(
        session, tenant_id=acme.id, since=now - timedelta(hours=1), until=now + timedelta(hours=1)
    )
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
    assert (tenant_row.requests_per_minute, tenant_row.tier_shares, tenant_row.tokens_per_minute) == (
        120,
        None,
        None,
    )
    assert tenant_row.allowed_tiers == ["standard"]
    assert get_quota(session, tenant_id=acme.id, key_id=key.id).max_concurrency == 2
    with pytest.raises(ValidationError):
        set_quota(session, tenant_id=acme.id, bogus=1)
    with pytest.raises(ValidationError):
        set_quota(session, tenant_id=acme.id, requests_per_minute=-1)


def _adapter(session, tenant_id, name, digest="a" * 64, rank=8):
    return create_adapter(
        session,
        tenant_id=tenant_id,
        name=name,
        sha256=digest,
        rank=rank,
        alpha=2.0 * rank,
        target_modules=["q_proj", "v_proj"],
        size_bytes=1234,
    )


def test_adapters_are_unique_per_tenant(session):
    acme, other = create_tenant(session, name="acme"), create_tenant(session, name="other")
    _adapter(session, acme.id, "sql")
    _adapter(session, other.id, "sql", rank=4)
    with pytest.raises(ConflictError):
        _adapter(session, acme.id, "sql", digest="b" * 64)
    assert [(a.name, a.rank) for a in list_adapters(session, tenant_id=acme.id)] == [("sql", 8)]
    row = list_adapters(session, tenant_id=other.id)[0]
    assert (row.alpha, row.target_modules, row.size_bytes) == (8.0, ["q_proj", "v_proj"], 1234)


def test_adapter_by_id_is_scoped_to_its_tenant_and_digests_are_shared(session):
    acme, other = create_tenant(session, name="acme"), create_tenant(session, name="other")
    a = _adapter(session, acme.id, "sql")
    b = _adapter(session, other.id, "bot")  # the same files: the same digest
    assert get_adapter_by_id(session, adapter_id=a.id).name == "sql"
    assert get_adapter_by_id(session, adapter_id=a.id, tenant_id=acme.id).id == a.id
    with pytest.raises(NotFoundError) as other_tenants:
        get_adapter_by_id(session, adapter_id=a.id, tenant_id=other.id)
    with pytest.raises(NotFoundError) as missing:
        get_adapter_by_id(session, adapter_id=a.id + b.id + 100, tenant_id=other.id)
    assert str(other_tenants.value).replace(str(a.id), "N") == str(missing.value).replace(
        str(a.id + b.id + 100), "N"
    )
    with pytest.raises(NotFoundError):
        delete_adapter(session, adapter_id=a.id, tenant_id=other.id)
    assert delete_adapter(session, adapter_id=a.id, tenant_id=acme.id).sha256 == "a" * 64
    assert digest_in_use(session, sha256="a" * 64)  # b still uses the files
    delete_adapter(session, adapter_id=b.id)
    assert not digest_in_use(session, sha256="a" * 64)
    with pytest.raises(ValidationError):
        create_adapter(
            session,
            tenant_id=acme.id,
            name="x",
            sha256="short",
            rank=8,
            alpha=1.0,
            target_modules=[],
            size_bytes=1,
        )
