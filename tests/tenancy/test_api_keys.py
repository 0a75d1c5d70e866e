"""API key CRUD and authentication on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from tenancy import (
    ApiKey,
    NotFoundError,
    ValidationError,
    authenticate_key,
    create_api_key,
    create_tenant,
    disable_tenant,
    hash_key,
    list_api_keys,
    revoke_api_key,
    touch_api_key,
)


def test_create_returns_secret_once_and_stores_only_its_hash(session):
    tenant = create_tenant(session, name="acme")
    created = create_api_key(session, tenant_id=tenant.id, name="ci", scopes=["inference", "adapters"])
    assert created.key.startswith(created.api_key.prefix + "_")
    stored = session.scalar(select(ApiKey).where(ApiKey.id == created.api_key.id))
    assert stored.secret_hash == hash_key(created.key)
    assert created.key not in {stored.prefix, stored.secret_hash, stored.name}
    assert stored.scopes == ["inference", "adapters"]
    assert not hasattr(stored, "key")
    with pytest.raises(ValidationError) as refused:  # a scope nothing checks would grant nothing
        create_api_key(session, tenant_id=tenant.id, scopes=["inference", "usage"])
    assert refused.value.param == "scopes"


def test_a_scope_named_twice_is_refused(session):
    # found by an exploratory run: ["inference", "inference"] was stored as given, twice
    tenant = create_tenant(session, name="acme")
    with pytest.raises(ValidationError) as refused:
        create_api_key(session, tenant_id=tenant.id, scopes=["inference", "adapters", "inference"])
    assert refused.value.param == "scopes" and "'inference'" in refused.value.message
    assert list_api_keys(session, tenant_id=tenant.id) == []


def test_authenticate_good_wrong_and_malformed_keys(session):
    tenant = create_tenant(session, name="acme")
    created = create_api_key(session, tenant_id=tenant.id)
    row, owner = authenticate_key(session, key=created.key)
    assert (row.id, owner.id) == (created.api_key.id, tenant.id)
    forged = created.api_key.prefix + "_" + "A" * 43  # right prefix, wrong secret
    assert authenticate_key(session, key=forged) is None
    assert authenticate_key(session, key="sk-not-ours") is None
    assert authenticate_key(session, key="") is None


def test_revoked_key_and_disabled_tenant_do_not_authenticate(session):
    tenant = create_tenant(session, name="acme")
    first = create_api_key(session, tenant_id=tenant.id)
    second = create_api_key(session, tenant_id=tenant.id)
    revoked = revoke_api_key(session, key_id=first.api_key.id)
    assert revoked.revoked_at is not None
    assert revoke_api_key(session, key_id=first.api_key.id).revoked_at == revoked.revoked_at
    assert authenticate_key(session, key=first.key) is None
    assert authenticate_key(session, key=second.key) is not None
    disable_tenant(session, tenant_id=tenant.id)
    assert authenticate_key(session, key=second.key) is None


def test_list_filters_revoked_and_checks_tenant(session):
    tenant = create_tenant(session, name="acme")
    keys = [create_api_key(session, tenant_id=tenant.id, name=f"k{i}") for i in range(3)]
    revoke_api_key(session, key_id=keys[1].api_key.id)
    assert [k.name for k in list_api_keys(session, tenant_id=tenant.id)] == ["k0", "k1", "k2"]
    assert [k.name for k in list_api_keys(session, tenant_id=tenant.id, include_revoked=False)] == [
        "k0",
        "k2",
    ]
    with pytest.raises(NotFoundError):
        list_api_keys(session, tenant_id=tenant.id + 1000)
    with pytest.raises(NotFoundError):
        create_api_key(session, tenant_id=tenant.id + 1000)
    with pytest.raises(NotFoundError):
        revoke_api_key(session, key_id=10_000)


def test_touch_sets_last_used(session):
    tenant = create_tenant(session, name="acme")
    created = create_api_key(session, tenant_id=tenant.id)
    assert created.api_key.last_used_at is None
    touch_api_key(session, key_id=created.api_key.id)
    session.expire_all()
    assert session.get(ApiKey, created.api_key.id).last_used_at is not None
