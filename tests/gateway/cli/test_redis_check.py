"""serve's look at the Redis it was given (gateway/cli/redis_check.py), on real servers: the
machine's Redis (a database number it does not have) and a Valkey of our own with a password and an
ACL user. A wrong password looked like an outage (503 for ever); a database number out of range
started a "healthy" gateway whose worker crash-looped and whose requests were 500s."""

from __future__ import annotations

import pytest
import redis as redislib
from serve_process import free_port, refused_serve

from gateway.cli.redis_check import redis_refusal, shown_url

PASSWORD = "s3cret-pw"


@pytest.fixture(scope="module")
def locked(start_valkey):
    """A Valkey whose default user needs PASSWORD, and a user alice (password alice-pw)."""
    server = start_valkey()
    client = redislib.Redis(port=server.port)
    client.execute_command("ACL", "SETUSER", "alice", "on", ">alice-pw", "~*", "+@all")
    client.config_set("requirepass", PASSWORD)
    client.close()
    yield server.port
    server.stop()


def test_a_database_number_the_server_does_not_have_is_refused(redis_url):
    refused = redis_refusal("redis://127.0.0.1:6379/99", "FAIRLANE_REDIS_URL")
    assert refused == (
        "Redis at redis://127.0.0.1:6379/99 (FAIRLANE_REDIS_URL) refused the connection: DB index is out "
        "of range (the number after the port selects a database: /0 is on every server)"
    )
    assert redis_refusal(redis_url, "FAIRLANE_REDIS_URL") is None


@pytest.mark.parametrize(
    "url, says",
    [
        ("redis://:wrong-pw@127.0.0.1:{port}/0", "invalid username-password pair"),
        ("redis://alice:wrong-pw@127.0.0.1:{port}/0", "invalid username-password pair"),
        ("redis://127.0.0.1:{port}/0?password=wrong-pw", "invalid username-password pair"),
        ("redis://127.0.0.1:{port}/0", "the server requires a password and the URL has none"),
    ],
)
def test_a_password_or_user_the_server_refuses_is_named_password_hidden(locked, url, says):
    refused = redis_refusal(url.format(port=locked), "FAIRLANE_QUOTA_REDIS_URL")
    assert refused.startswith("authentication to Redis failed at redis://") and says in refused
    assert "FAIRLANE_QUOTA_REDIS_URL" in refused and "wrong-pw" not in refused and "\n" not in refused


def test_the_right_password_or_user_passes_and_a_server_not_answering_is_left_to_ready(locked):
    assert redis_refusal(f"redis://:{PASSWORD}@127.0.0.1:{locked}/0", "FAIRLANE_REDIS_URL") is None
    assert redis_refusal(f"redis://alice:alice-pw@127.0.0.1:{locked}/0", "FAIRLANE_REDIS_URL") is None
    assert redis_refusal(f"redis://127.0.0.1:{free_port()}/0", "FAIRLANE_REDIS_URL") is None  # may come


def test_shown_url_hides_every_password():
    assert shown_url("redis://:pw@h:1/0") == "redis://:***@h:1/0"
    assert (
        shown_url("rediss://alice:pw@h:1/2?ssl_cert_reqs=none")
        == "rediss://alice:***@h:1/2?ssl_cert_reqs=none"
    )
    assert shown_url("redis://alice@h:1/0") == "redis://alice@h:1/0"
    assert shown_url("unix:///tmp/r.sock?db=1&password=pw") == "unix:///tmp/r.sock?db=1&password=***"


@pytest.mark.parametrize("url", ["redis://:wrong-pw@127.0.0.1:{port}/0", "redis://127.0.0.1:6379/99"])
def test_serve_refuses_to_start_in_one_line(locked, tmp_path, url):
    """The whole command: one line on stderr, exit status 1, nothing started (no database made)."""
    env = {
        "FAIRLANE_CONFIG": "",
        "FAIRLANE_ENGINE__MODEL": "dummy",
        "FAIRLANE_REDIS_URL": url.format(port=locked),
        "FAIRLANE_DATABASE_URL": f"sqlite:///{tmp_path / 'fairlane.db'}",
    }
    output = refused_serve(env, timeout_s=60)
    assert len(output.strip().splitlines()) == 1, output
    assert output.startswith("fairlane serve: ") and "FAIRLANE_REDIS_URL" in output
    assert "wrong-pw" not in output and "fl-" not in output
    assert not (tmp_path / "fairlane.db").exists()
