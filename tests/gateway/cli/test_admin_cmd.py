"""`fairlane admin` against a live gateway (a real uvicorn server on a port, real Redis and
database) and straight on the database (SQLite, and PostgreSQL when FAIRLANE_TEST_POSTGRES_URL is
set), with the same commands and the same answers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
import redis as redislib
from gateway_test_helpers import ADMIN_TOKEN

from gateway.cli import build_parser
from quotas import KeySpace
from tenancy import make_engine, make_session_factory, record_usage, upgrade


def admin(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    args = build_parser().parse_args(["admin", *argv])
    code = args.func(args)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def live_gateway(settings, free_tcp_port):
    """The gateway app served by uvicorn on a real port, in a thread (no worker: admin only)."""
    import uvicorn

    from gateway.api.app import create_app

    server = uvicorn.Server(
        uvicorn.Config(create_app(settings), host="127.0.0.1", port=free_tcp_port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the gateway did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{free_tcp_port}"
    server.should_exit = True
    thread.join(timeout=30)


def _walk(capsys, target: list[str], database_url: str) -> dict:
    """The same script of commands on either target; returns what it saw."""
    code, out, _ = admin(
        capsys, *target, "tenants", "create", "acme", "--weight", "2", "--ttft-target", "1.5"
    )
    assert code == 0
    tenant = json.loads(out)
    assert (tenant["name"], tenant["weight"], tenant["ttft_target_s"]) == ("acme", 2.0, 1.5)
    code, out, _ = admin(
        capsys, *target, "tenants", "update", "acme", "--weight", "3", "--allowed-tiers", "standard"
    )
    assert code == 0 and json.loads(out)["weight"] == 3.0 and json.loads(out)["allowed_tiers"] == ["standard"]
    code, out, _ = admin(capsys, *target, "keys", "create", str(tenant["id"]), "--name", "ci")
    key = json.loads(out)
    assert code == 0 and key["key"].startswith(key["prefix"] + "_") and key["name"] == "ci"
    code, out, _ = admin(
        capsys,
        *target,
        "quotas",
        "set",
        "acme",
        "--rpm",
        "60",
        "--daily-tokens",
        "1000",
        "--tier-share",
        "standard=0.5",
    )
    quota = json.loads(out)
    assert code == 0 and (quota["requests_per_minute"], quota["daily_token_budget"]) == (60, 1000)
    assert quota["tier_shares"] == {"standard": 0.5} and quota["tokens_per_minute"] is None
    code, out, _ = admin(
        capsys, *target, "quotas", "set", "acme", "--key", str(key["id"]), "--max-concurrency", "2"
    )
    assert code == 0 and json.loads(out)["key_id"] == key["id"]
    engine = make_engine(database_url)
    with make_session_factory(engine)() as session:
        for i in range(3):
            record_usage(
                session,
                request_id=f"r{uuid.uuid4().hex}",
                tenant_id=tenant["id"],
                key_id=key["id"],
                model="m",
                tier="standard",
                prompt_tokens=10,
                completion_tokens=i,
                status="stop",
            )
    engine.dispose()
    since = (datetime.now(UTC) - timedelta(days=1)).date().isoformat()
    code, out, _ = admin(capsys, *target, "usage", "--tenant", "acme", "--since", since, "--csv")
    lines = out.strip().splitlines()
    assert code == 0 and lines[0].startswith("start,tenant_id,key_id,requests,prompt_tokens")
    assert [line.split(",")[2:6] for line in lines[1:]] == [[str(key["id"]), "3", "30", "3"]]
    code, out, _ = admin(capsys, *target, "usage", "--since", since, "--bucket", "day")
    assert code == 0 and json.loads(out)[0]["tenant_id"] == tenant["id"]
    code, out, _ = admin(capsys, *target, "keys", "revoke", str(key["id"]))
    assert code == 0 and json.loads(out)["revoked_at"]
    code, out, _ = admin(capsys, *target, "tenants", "update", "acme", "--disable")
    assert code == 0 and json.loads(out)["status"] == "disabled"
    code, out, _ = admin(capsys, *target, "tenants", "list")
    assert code == 0 and out.splitlines()[1].split() == [
        str(tenant["id"]),
        "acme",
        "3",
        "standard",
        "standard",
        "disabled",
    ]
    for where in (["--json", "tenants", "list"], ["tenants", "list", "--json"]):  # either place
        code, out, _ = admin(capsys, *target, *where)
        assert code == 0 and [t["name"] for t in json.loads(out)] == ["acme"]
    code, _, err = admin(capsys, *target, "tenants", "create", "acme")
    assert code == 1 and "already exists" in err
    code, _, err = admin(capsys, *target, "quotas", "set", "nobody", "--rpm", "1")
    assert code == 1 and "not found" in err
    # a tenant whose name is another's id: a reference to it is refused, never resolved to either
    code, out, _ = admin(capsys, *target, "tenants", "create", str(tenant["id"]))
    assert code == 0
    code, _, err = admin(capsys, *target, "keys", "create", str(tenant["id"]), "--name", "which")
    assert code == 1 and "the id of tenant" in err
    for flag in ("--weight", "--ttft-target"):
        with pytest.raises(SystemExit):  # argparse refuses it: nothing reaches the backend
            admin(capsys, *target, "tenants", "create", "w", flag, "nan")
        assert "not a finite number" in capsys.readouterr().err
    return {"tenant": tenant, "key": key}


def test_admin_against_a_live_gateway(capsys, live_gateway, settings, redis_url):
    seen = _walk(capsys, ["--url", live_gateway, "--token", ADMIN_TOKEN], settings.database_url)
    client = redislib.Redis.from_url(redis_url)  # the gateway pushed the quota to Redis
    limits = client.hgetall(KeySpace(settings.quota_key_prefix).limits(str(seen["tenant"]["id"])))
    client.close()
    assert limits, "the quota did not reach Redis"
    code, _, err = admin(capsys, "--url", live_gateway, "--token", "not-the-admin-token", "tenants", "list")
    assert code == 1 and "401" in err


@pytest.fixture(params=["sqlite", "postgresql"])
def any_database(request, tmp_path):
    """A migrated database of each backend (PostgreSQL: a fresh one, dropped after)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'admin.db'}"
        upgrade(url)
        yield url
        return
    base = os.environ.get("FAIRLANE_TEST_POSTGRES_URL")
    if not base:
        pytest.skip("FAIRLANE_TEST_POSTGRES_URL is not set: PostgreSQL tests not run")
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    server, name = (
        create_engine(base, isolation_level="AUTOCOMMIT"),
        f"fairlane_admin_{uuid.uuid4().hex[:10]}",
    )
    with server.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        url = make_url(base).set(database=name).render_as_string(hide_password=False)
        upgrade(url)
        yield url
    finally:
        with server.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        server.dispose()


def test_admin_straight_on_the_database(capsys, any_database, redis_url):
    prefix = f"fltest:admin:{uuid.uuid4().hex[:8]}"
    target = ["--database-url", any_database, "--redis-url", redis_url, "--quota-key-prefix", prefix]
    seen = _walk(capsys, target, any_database)
    client = redislib.Redis.from_url(redis_url)
    try:
        assert client.hgetall(KeySpace(prefix).limits(str(seen["tenant"]["id"])))
    finally:
        for key in client.scan_iter(match=f"{prefix}:*"):
            client.delete(key)
        client.close()


def test_the_installed_command_runs(tmp_path):
    url = f"sqlite:///{tmp_path / 'cmd.db'}"
    upgrade(url)
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    run = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "admin", "--database-url", url, "--json", "tenants", "list"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert run.returncode == 0 and json.loads(run.stdout) == []
