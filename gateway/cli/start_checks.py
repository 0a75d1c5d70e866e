"""What stops ``fairlane serve`` at its start, each in one line: a port it cannot bind (why, by
errno), a model the engine cannot serve exactly, a Redis it was given that refuses it
(gateway/cli/redis_check.py), an engine.device the workers cannot run on
(gateway/cli/device_check.py), a database it cannot migrate."""

from __future__ import annotations

import errno
import socket
import struct
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.settings import ServeSettings

# what the engine's checkpoint check raises on a damaged file (a header length past the file:
# OverflowError; a header that is not JSON: ValueError; a file under 8 bytes: struct.error)
UNREADABLE = (OSError, ValueError, OverflowError, struct.error)


def _first_unprivileged_port() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_unprivileged_port_start") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 1024


def cannot_listen(host: str, port: int, exc: OSError) -> str:
    """serve's one line for a port it could not bind, saying why by errno."""
    where = f"fairlane serve: cannot listen on {host}:{port}"
    if isinstance(exc, socket.gaierror):
        return f"{where}: the host {host!r} is not an address or a name this machine resolves (--host)"
    if exc.errno == errno.EADDRINUSE:
        return f"{where}: port {port} is taken by another server (choose another with --port)"
    if exc.errno == errno.EACCES:
        return (
            f"{where}: permission denied: ports below {_first_unprivileged_port()} need privileges "
            "on this host (choose a higher one with --port)"
        )
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"{where}: {host} is not an address of this host (--host; 0.0.0.0 listens on every one)"
    return f"{where}: {exc.strerror or exc}"


def _refuse_model(model: str) -> str | None:
    """Why `model` cannot be served (the engine's checkpoint check: config and tensor names, no
    weights read; a folder without the tokenizer the gateway needs), or None."""
    from engine import UnsupportedModelError, assets, check_model

    try:
        check_model(model)
        source = assets.resolve_model(model)
    except (UnsupportedModelError, FileNotFoundError) as exc:
        return str(exc)
    except UNREADABLE as exc:  # a damaged or truncated file: the check's reader fails on it
        return f"its checkpoint cannot be read ({type(exc).__name__}: {exc})"
    if source.kind == "folder" and not assets.has_tokenizer(source.files):
        return "the folder has no tokenizer (tokenizer.json): the gateway needs one to tokenize prompts"
    return None


def _refuse_redis(settings: ServeSettings) -> str | None:
    """Why a Redis the settings name can never serve (its password, user or database number
    refused), or None (gateway/cli/redis_check.py). The embedded one is serve's own."""
    from gateway.cli.redis_check import redis_refusal

    for setting, url in (
        ("FAIRLANE_REDIS_URL", settings.redis_url),
        ("FAIRLANE_QUOTA_REDIS_URL", settings.quota_redis_url),
    ):
        refused = url and redis_refusal(url, setting)
        if refused:
            return refused
    return None


def refusal(settings: ServeSettings) -> str | None:
    """Why serve cannot work with these settings, in one line, or None: the model, the Redis it was
    given, the engine's device (checked in a child process beside the other two: it imports torch)."""
    from gateway.cli.device_check import start_device_probe

    probe = start_device_probe(settings.engine.device, settings.workers)
    try:
        refused = _refuse_model(settings.engine.model)
        if refused:
            return f"cannot serve model {settings.engine.model!r}: {refused}"
        return _refuse_redis(settings) or (probe.refusal() if probe else None)
    finally:
        if probe is not None:
            probe.close()


def migrate(upgrade, url: str) -> None:
    """Bring the database to the current schema, or stop naming what is wrong with it in one line
    (a database that is not there, a server that does not answer, a URL SQLAlchemy cannot use)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, SQLAlchemyError

    try:
        shown = make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        raise SystemExit(f"fairlane serve: FAIRLANE_DATABASE_URL is not a database URL: {url!r}") from None
    try:
        upgrade(url)
    except (SQLAlchemyError, ImportError) as exc:
        reason = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or [type(exc).__name__])[0]
        hint = ""
        if shown.startswith("postgres:"):
            hint = " (SQLAlchemy names PostgreSQL postgresql://; use postgresql+psycopg://...)"
        elif isinstance(exc, ImportError):
            hint = " (fairlane ships the psycopg driver: postgresql+psycopg://...)"
        raise SystemExit(f"fairlane serve: cannot use the database {shown}: {reason}{hint}") from None
