"""Migrations: upgrade from empty, downgrade to base, and the models match the head."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from tenancy import Base, current_revision, downgrade, make_engine, upgrade

TABLES = {"tenants", "api_keys", "adapters", "quotas", "usage_records", "usage_hourly"}
HEAD = "0005"


def _tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def _diff(url: str) -> list:
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            return compare_metadata(context, Base.metadata)
    finally:
        engine.dispose()


def test_downgrade_to_base_then_upgrade_from_empty(migrated_url):
    assert _tables(migrated_url) == TABLES
    downgrade(migrated_url)
    assert _tables(migrated_url) == set()
    assert current_revision(migrated_url) is None
    upgrade(migrated_url)
    assert _tables(migrated_url) == TABLES
    assert current_revision(migrated_url) == HEAD


def test_models_match_migration_head(migrated_url):
    assert _diff(migrated_url) == []


def test_upgrade_is_idempotent_at_head(migrated_url):
    upgrade(migrated_url)
    assert current_revision(migrated_url) == HEAD


def test_concurrent_upgrades_from_several_processes(migrated_url):
    import multiprocessing

    downgrade(migrated_url)
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=upgrade, args=(migrated_url,)) for _ in range(3)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)
    assert [p.exitcode for p in processes] == [0, 0, 0]
    assert current_revision(migrated_url) == HEAD and _tables(migrated_url) == TABLES


def test_tenant_slo_targets_survive_a_downgrade_to_0001_and_back(migrated_url, db_engine):
    from sqlalchemy import text

    from tenancy import create_tenant, make_session_factory

    with make_session_factory(db_engine)() as session:
        create_tenant(session, name="slo", ttft_target_s=0.5)
    db_engine.dispose()
    downgrade(migrated_url, "0001")
    assert current_revision(migrated_url) == "0001"
    assert "ttft_target_s" not in {c["name"] for c in inspect(db_engine).get_columns("tenants")}
    upgrade(migrated_url)
    db_engine.dispose()
    with db_engine.connect() as connection:  # the tenant is still there; its own target is gone
        assert connection.execute(text("SELECT name, ttft_target_s FROM tenants")).all() == [("slo", None)]


def test_adapter_rows_of_0002_survive_0003_without_files_and_back(migrated_url, db_engine):
    """A row of 0002 named a folder; at 0003 it is kept with an empty digest (never served), and a
    downgrade keeps the rows of 0003 with an empty path."""
    from sqlalchemy import text

    from tenancy import create_tenant, make_session_factory

    with make_session_factory(db_engine)() as session:
        tenant_id = create_tenant(session, name="old").id
    db_engine.dispose()
    downgrade(migrated_url, "0002")
    with db_engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO adapters (tenant_id, name, path, rank, created_at) "
                "VALUES (:t, 'legacy', '/x/legacy', 8, CURRENT_TIMESTAMP)"
            ),
            {"t": tenant_id},
        )
    db_engine.dispose()
    upgrade(migrated_url)
    db_engine.dispose()
    with db_engine.connect() as connection:
        row = connection.execute(text("SELECT name, sha256, rank, size_bytes FROM adapters")).one()
    assert tuple(row) == ("legacy", "", 8, 0)
    db_engine.dispose()
    downgrade(migrated_url, "0002")
    with db_engine.connect() as connection:
        assert connection.execute(text("SELECT name, path FROM adapters")).all() == [("legacy", "")]
    db_engine.dispose()
    upgrade(migrated_url)
