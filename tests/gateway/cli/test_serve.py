"""``fairlane serve``'s settings (gateway/cli/serve.py): what the command line and the environment
make of them, without starting anything."""

from __future__ import annotations

import pytest

from gateway.cli import build_parser
from gateway.cli.serve import _settings
from gateway.cli.start_checks import migrate


@pytest.fixture
def no_config(monkeypatch, tmp_path):
    monkeypatch.setenv("FAIRLANE_CONFIG", "")
    monkeypatch.delenv("FAIRLANE_ADMIN_TOKEN", raising=False)
    monkeypatch.delenv("FAIRLANE_DEV", raising=False)


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_dev_mode_without_a_token_gets_one_made(no_config, monkeypatch, how):
    """FAIRLANE_DEV=true is dev mode as --dev is: it used to print an empty admin token, and the
    admin API could not be used."""
    argv = ["serve", "--dev"] if how == "flag" else ["serve"]
    if how == "environment":
        monkeypatch.setenv("FAIRLANE_DEV", "true")
    settings = _settings(build_parser().parse_args(argv))
    assert settings.dev and settings.admin_token.startswith("fl-admin-") and len(settings.admin_token) > 30


def test_a_token_given_is_kept_in_dev_mode(no_config, monkeypatch):
    monkeypatch.setenv("FAIRLANE_ADMIN_TOKEN", "a-token-of-my-own-1234")
    assert _settings(build_parser().parse_args(["serve", "--dev"])).admin_token == "a-token-of-my-own-1234"


@pytest.mark.parametrize(
    "url, says",
    [
        (
            "postgresql+psycopg://postgres:pw@127.0.0.1:{port}/test",
            "postgres:***@127.0.0.1",
        ),  # password hidden
        ("postgres://postgres@127.0.0.1:{port}/test", "use postgresql+psycopg://"),
        ("postgresql+asyncpg://postgres@127.0.0.1:{port}/test", "ships the psycopg driver"),
        ("not a url", "is not a database URL"),
    ],
)
def test_a_database_serve_cannot_use_stops_it_in_one_line(free_tcp_port, url, says):
    """A database URL that cannot work printed SQLAlchemy's or Alembic's traceback (129 lines)."""
    from tenancy import upgrade

    with pytest.raises(SystemExit) as stopped:
        migrate(upgrade, url.format(port=free_tcp_port))  # nothing listens on the port
    message = str(stopped.value)
    assert message.startswith("fairlane serve: ") and says in message and "\n" not in message
    assert ":pw@" not in message
