"""The `fairlane` command as a user runs it: subcommands, and serve's refusal of a weak admin token."""

from __future__ import annotations

import os
import subprocess

from serve_process import REPO, fairlane_command


def _run(args: list[str], **env: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": REPO, "FAIRLANE_CONFIG": "", **env}
    full_env.pop("FAIRLANE_DEV", None)
    return subprocess.run(
        [*fairlane_command(), *args], env=full_env, cwd=REPO, capture_output=True, text=True, timeout=120
    )


def test_help_lists_the_subcommands():
    result = _run(["--help"])
    assert result.returncode == 0
    for command in ("serve", "worker", "generate"):
        assert command in result.stdout


def test_serve_refuses_an_empty_or_default_admin_token(tmp_path):
    for token in ("", "changeme"):
        result = _run(
            ["serve", "--port", "1"],
            FAIRLANE_ADMIN_TOKEN=token,
            FAIRLANE_DATABASE_URL=f"sqlite:///{tmp_path / 'x.db'}",
        )
        assert result.returncode != 0
        assert "FAIRLANE_ADMIN_TOKEN" in result.stderr + result.stdout
        assert "--dev" in result.stderr + result.stdout
    assert not (tmp_path / "x.db").exists()  # refused before touching anything


def test_serve_help_documents_dev_mode():
    result = _run(["serve", "--help"])
    assert result.returncode == 0 and "--dev" in result.stdout and "--workers" in result.stdout


def test_policy_option_of_serve_and_worker_is_checked_before_anything_starts(tmp_path):
    for command in (["serve", "--dev", "--port", "1"], ["worker"]):
        result = _run(
            [*command, "--policy", "priority+fair"],
            FAIRLANE_REDIS_URL="redis://127.0.0.1:1/0",
            FAIRLANE_ADMIN_TOKEN="a-strong-admin-token-0123456789",
            FAIRLANE_DATABASE_URL=f"sqlite:///{tmp_path / 'x.db'}",
        )
        assert result.returncode != 0 and "unknown part(s) ['fair']" in result.stderr + result.stdout
        assert "Traceback" not in result.stderr
        assert "--policy" in _run([*command[:1], "--help"]).stdout
    assert not (tmp_path / "x.db").exists()


def test_an_unknown_setting_stops_serve_and_worker_naming_it(tmp_path):
    for command in (["serve", "--dev", "--port", "1"], ["worker"]):
        result = _run(
            command,
            FAIRLANE_KV_CACHE_GIB="2",
            FAIRLANE_REDIS_URL="redis://127.0.0.1:1/0",
            FAIRLANE_DATABASE_URL=f"sqlite:///{tmp_path / 'x.db'}",
        )
        output = result.stderr + result.stdout
        assert result.returncode != 0 and "Traceback" not in output
        assert (
            "unknown setting FAIRLANE_KV_CACHE_GIB; engine fields are set as FAIRLANE_ENGINE__KV_CACHE_GIB"
            in output
        )
    config = tmp_path / "fairlane.yaml"
    config.write_text("engine: {kv_cache_gb: 2}\n")
    result = _run(
        ["serve", "--dev", "--port", "1"],
        FAIRLANE_CONFIG=str(config),
        FAIRLANE_DATABASE_URL=f"sqlite:///{tmp_path / 'x.db'}",
    )
    assert result.returncode != 0 and "unknown key 'engine.kv_cache_gb'" in result.stderr + result.stdout
    assert not (tmp_path / "x.db").exists()  # refused before touching anything
