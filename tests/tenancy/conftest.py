"""Database fixtures: every test here runs on SQLite and on PostgreSQL.

PostgreSQL comes from FAIRLANE_TEST_POSTGRES_URL (set by .ci/run); one uniquely named database is
created for the test session and dropped after it. If the URL is set and the server does not
answer, the tests fail; without the URL they are skipped with a visible reason.
"""

from __future__ import annotations

import os
import uuid

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tenancy import Base, make_engine, make_session_factory, upgrade

POSTGRES_ENV = "FAIRLANE_TEST_POSTGRES_URL"


@pytest.fixture(scope="session")
def postgres_url():
    base_url = os.environ.get(POSTGRES_ENV)
    if not base_url:
        pytest.skip(f"{POSTGRES_ENV} is not set: PostgreSQL tests not run")
    admin = create_engine(base_url, isolation_level="AUTOCOMMIT")
    name = f"fairlane_test_{uuid.uuid4().hex[:12]}"
    try:
        with admin.connect() as connection:  # raises (test error) when the server is down
            connection.execute(text(f'CREATE DATABASE "{name}"'))
        yield make_url(base_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="session", params=["sqlite", "postgresql"])
def migrated_url(request, tmp_path_factory):
    """A database at the migration head, one per backend for the whole session."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'fairlane.db'}"
    else:
        url = request.getfixturevalue("postgres_url")
    upgrade(url)
    return url


@pytest.fixture
def db_engine(migrated_url):
    engine = make_engine(migrated_url)
    yield engine
    with engine.begin() as connection:  # leave the schema empty for the next test
        for table in reversed(Base.metadata.sorted_tables):
            connection.execute(table.delete())
    engine.dispose()


@pytest.fixture
def session(db_engine):
    with make_session_factory(db_engine)() as session:
        yield session
