"""Tenant CRUD on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from tenancy import (
    ConflictError,
    NotFoundError,
    ValidationError,
    create_tenant,
    disable_tenant,
    get_tenant,
    get_tenant_by_name,
    list_tenants,
    update_tenant,
)


def test_create_with_defaults_and_get(session):
    tenant = create_tenant(session, name="acme")
    assert tenant.id is not None
    assert (tenant.weight, tenant.default_tier, tenant.allowed_tiers, tenant.status) == (
        1.0,
        "standard",
        ["standard", "batch"],
        "active",
    )
    assert tenant.created_at is not None
    session.expire_all()
    assert get_tenant(session, tenant_id=tenant.id).name == "acme"
    assert get_tenant_by_name(session, name="acme").id == tenant.id


def test_names_are_unique(session):
    create_tenant(session, name="acme")
    with pytest.raises(ConflictError) as excinfo:
        create_tenant(session, name="acme")
    assert excinfo.value.param == "name"


def test_invalid_values_are_refused(session):
    with pytest.raises(ValidationError):
        create_tenant(session, name="w", weight=0)
    with pytest.raises(ValidationError) as excinfo:
        create_tenant(session, name="t", default_tier="priority", allowed_tiers=["standard"])
    assert excinfo.value.param == "default_tier"
    # every way in (the admin CLI's database backend included) gets the API's bounds: a NaN weight
    # reached the lanes as null and killed the engine worker; an infinite target read back as "none"
    for weight in (float("nan"), float("inf"), 0.001, 101.0):
        with pytest.raises(ValidationError) as excinfo:
            create_tenant(session, name="w", weight=weight)
        assert excinfo.value.param == "weight"
    for target in (float("nan"), float("inf"), 0.0):
        with pytest.raises(ValidationError) as excinfo:
            create_tenant(session, name="w", ttft_target_s=target)
        assert excinfo.value.param == "ttft_target_s"
    assert list_tenants(session) == []
    tenant = create_tenant(session, name="ok")
    for fields in ({"weight": float("nan")}, {"tpot_target_s": float("inf")}):
        with pytest.raises(ValidationError):
            update_tenant(session, tenant_id=tenant.id, **fields)


def test_update_changes_only_given_fields(session):
    tenant = create_tenant(session, name="acme", weight=2.0)
    update_tenant(
        session, tenant_id=tenant.id, allowed_tiers=["priority", "standard"], default_tier="priority"
    )
    session.expire_all()
    fresh = get_tenant(session, tenant_id=tenant.id)
    assert (fresh.name, fresh.weight, fresh.default_tier) == ("acme", 2.0, "priority")
    assert fresh.allowed_tiers == ["priority", "standard"]
    with pytest.raises(ValidationError):
        update_tenant(session, tenant_id=tenant.id, allowed_tiers=["batch"])  # default would fall outside


def test_rename_conflict_and_missing(session):
    create_tenant(session, name="a")
    b = create_tenant(session, name="b")
    with pytest.raises(ConflictError):
        update_tenant(session, tenant_id=b.id, name="a")
    with pytest.raises(NotFoundError):
        get_tenant(session, tenant_id=10_000)
    with pytest.raises(NotFoundError):
        get_tenant_by_name(session, name="nobody")


def test_disable_and_list(session):
    a = create_tenant(session, name="a")
    create_tenant(session, name="b")
    disable_tenant(session, tenant_id=a.id)
    assert [t.name for t in list_tenants(session)] == ["a", "b"]
    assert [t.name for t in list_tenants(session, include_disabled=False)] == ["b"]
    assert get_tenant(session, tenant_id=a.id).status == "disabled"
    with pytest.raises(ValidationError):
        update_tenant(session, tenant_id=a.id, status="deleted")


def test_a_tier_named_twice_is_refused(session):
    """allowed_tiers ["batch", "batch"] was stored as given (tenants and quotas)."""
    from tenancy import set_quota

    with pytest.raises(ValidationError, match="'batch' more than once") as excinfo:
        create_tenant(session, name="t", default_tier="batch", allowed_tiers=["batch", "batch"])
    assert excinfo.value.param == "allowed_tiers" and list_tenants(session) == []
    tenant = create_tenant(session, name="t")
    with pytest.raises(ValidationError, match="'standard' more than once"):
        update_tenant(session, tenant_id=tenant.id, allowed_tiers=["standard", "batch", "standard"])
    with pytest.raises(ValidationError, match="'batch' more than once") as excinfo:
        set_quota(session, tenant_id=tenant.id, allowed_tiers=["batch", "batch"])
    assert excinfo.value.param == "allowed_tiers"
    assert update_tenant(session, tenant_id=tenant.id, weight=2.0).allowed_tiers == ["standard", "batch"]
