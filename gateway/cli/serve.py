"""``fairlane serve``: everything on one machine — Redis (embedded unless FAIRLANE_REDIS_URL), the
database (SQLite unless FAIRLANE_DATABASE_URL, migrated at start), engine worker processes and the
gateway. ``--dev`` generates an admin token and a demo tenant key and prints both.

Order of a start: settings, then the port (bound before anything else: a port it cannot bind stops
serve at once, saying why, with nothing started or printed), the model check (a checkpoint the
engine cannot serve exactly stops serve there, naming what is unsupported, with nothing started),
the Redis it was given (a password, user or database number the server refuses stops serve there:
gateway/cli/redis_check.py) and a CUDA engine.device torch cannot see (gateway/cli/device_check.py),
then the embedded Redis, the database, the workers and the gateway.
The workers and the embedded Redis run under a supervisor that restarts them when they die
(gateway/cli/supervisor.py). On SIGTERM or SIGINT the gateway stops
accepting and lets in-flight requests finish for up to ``drain_timeout_s``, then the workers stop,
then Redis, its temporary folder is removed and serve exits 0. The workers read the same environment
and YAML file; what the command line overrides and the Redis it started reach them as FAIRLANE_*
variables, with the thread policy of a shared host (gateway/cli/threads.py) where the operator set
none.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys

from gateway.cli.start_checks import cannot_listen, migrate, refusal
from gateway.cli.torch_free import tokenizer_without_torch, torch_free
from gateway.settings import ServeSettings, load_settings
from gateway.telemetry import multiproc
from gateway.telemetry.logs import setup_logging

log = logging.getLogger("fairlane.serve")
DEMO_TENANT = "demo"
LISTEN_BACKLOG = 2048
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# serve's resolved settings for its extra gateway processes (gateway/cli/gateway_process.py): not a
# FAIRLANE_* setting, read (and removed) before their settings load
SETTINGS_ENV = "FL_SERVE_SETTINGS_JSON"
GRACE_S = 5.0  # an extra gateway process may take this long past drain_timeout_s to stop (its shutdown)


class Stopping(Exception):
    """SIGTERM or SIGINT arrived before the gateway was serving."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dev", action="store_true", help="generate an admin token and a demo tenant key")
    parser.add_argument("--host", help="bind address (default from settings: 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (default from settings: 8000)")
    parser.add_argument("--workers", type=int, help="engine worker processes to start (0: gateway only)")
    parser.add_argument(
        "--gateway-workers",
        type=int,
        help="gateway processes serving the port (default 1; they share only Redis and the database)",
    )
    parser.add_argument(
        "--model", help="engine.model: 'smollm2', 'dummy', a Hugging Face folder or a .gguf file"
    )


def _settings(args: argparse.Namespace) -> ServeSettings:
    overrides = {
        k: v
        for k, v in (
            ("host", args.host),
            ("port", args.port),
            ("workers", args.workers),
            ("gateway_workers", getattr(args, "gateway_workers", None)),
        )
        if v is not None
    }
    engine = {k: v for k, v in (("model", args.model), ("policy", args.policy)) if v is not None}
    if engine:
        overrides["engine"] = engine
    if args.dev:
        overrides["dev"] = True
    settings = load_settings(ServeSettings, "fairlane serve", **overrides)
    if settings.dev and not settings.admin_token:  # --dev, or FAIRLANE_DEV=true, with no token set
        settings = settings.model_copy(update={"admin_token": "fl-admin-" + secrets.token_urlsafe(24)})
    return settings


def bind(host: str, port: int) -> socket.socket:
    """The gateway's listening socket, bound now (uvicorn serves on it later)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _name, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # not SO_REUSEPORT: a taken port must fail
    try:
        sock.bind(address)
        sock.listen(LISTEN_BACKLOG)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(False)
    return sock


def _demo_key(database_url: str) -> str:
    from tenancy import (
        ConflictError,
        create_api_key,
        create_tenant,
        get_tenant_by_name,
        make_engine,
        make_session_factory,
    )

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


def _worker_spawner(settings: ServeSettings, redis_url: str):
    from gateway.cli.supervisor import child_setup
    from gateway.cli.threads import worker_env

    env = {
        **os.environ,
        **worker_env(os.environ, settings.engine.num_threads, settings.workers),
        "FAIRLANE_REDIS_URL": redis_url,
        "FAIRLANE_ENGINE__MODEL": settings.engine.model,
        "FAIRLANE_ENGINE__POLICY": settings.engine.policy,
    }

    def spawn() -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "gateway.worker"],
            env=env,
            stdin=subprocess.DEVNULL,
            process_group=0,
            preexec_fn=child_setup,
        )

    return spawn


def _gateway_spawner(settings: ServeSettings, sock: socket.socket):
    """Another gateway process on ``sock`` (gateway/cli/gateway_process.py), with serve's settings."""
    from gateway.cli.supervisor import child_setup

    env = {**os.environ, SETTINGS_ENV: json.dumps(settings.model_dump(mode="json"))}

    def spawn() -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "gateway.cli.gateway_process", "--fd", str(sock.fileno())],
            env=env,
            stdin=subprocess.DEVNULL,
            pass_fds=(sock.fileno(),),
            process_group=0,
            preexec_fn=child_setup,
        )

    return spawn


def _installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def event_loop() -> str:
    """The event loop of a gateway process: uvloop when installed, else asyncio's."""
    return "uvloop" if _installed("uvloop") else "asyncio"


def uvicorn_config(app, settings: ServeSettings):
    """uvicorn's settings of a gateway process: httptools when installed, ``event_loop()``, no
    access log (the gateway writes its own request line), uvicorn's records through this process's
    handler."""
    import uvicorn

    return uvicorn.Config(
        app,
        http="httptools" if _installed("httptools") else "h11",
        loop=event_loop(),
        access_log=False,
        log_level="warning",
        timeout_graceful_shutdown=settings.drain_timeout_s,
        log_config=None,
    )


def _raise_stopping(signum, _frame) -> None:
    raise Stopping(signal.Signals(signum).name)


def _serve(app, sock: socket.socket, settings: ServeSettings, on_stop=lambda: None) -> None:
    """uvicorn on ``sock`` until SIGTERM/SIGINT, draining in-flight requests for drain_timeout_s;
    ``on_stop()`` runs when the signal comes (serve stops its other gateway processes then, so
    that they drain at the same time). uvicorn re-raises the signal once it has stopped, which would
    end serve before it stops its children: this server keeps the signal to itself."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            on_stop()
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self):
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in STOP_SIGNALS}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    Server(uvicorn_config(app, settings)).run(sockets=[sock])


def main(args: argparse.Namespace) -> int:
    settings = _settings(args)
    setup_logging(settings, "gateway")
    try:
        sock = bind(settings.host, settings.port)
    except OSError as exc:
        print(cannot_listen(settings.host, settings.port, exc), file=sys.stderr, flush=True)
        return 1
    if tokenizer_without_torch(settings.engine.model):
        torch_free()  # this gateway process; the workers are processes of their own
    refused = refusal(settings)
    if refused:
        print(f"fairlane serve: {refused}", file=sys.stderr, flush=True)
        sock.close()
        return 1
    for sig in STOP_SIGNALS:
        signal.signal(sig, _raise_stopping)
    from gateway.cli.supervisor import Supervisor

    # A dead worker's live gauges (running sequences, KV blocks) leave the scrape with it.
    supervisor, embedded = (
        Supervisor(
            max_backoff_s=settings.restart_backoff_max_s,
            on_exit=lambda name, pid: multiproc.forget_process(pid),
        ),
        None,
    )
    # Metrics of this process and its workers in one scrape: the directory must be set before the
    # app (and prometheus_client's metrics) are imported (gateway/telemetry/multiproc.py).
    metrics_dir = multiproc.begin()
    try:
        if not settings.redis_url:
            from gateway.cli.embedded_redis import EmbeddedRedis

            embedded = EmbeddedRedis()
            supervisor.add("redis", embedded.spawn, first_backoff_s=0.2)
            settings = settings.model_copy(update={"redis_url": embedded.url})
        # The workers start now: they need Redis, not the database, and their start (torch, the
        # weights) overlaps the gateway's own (the app's import, the migrations, the demo key).
        spawn_worker = _worker_spawner(settings, settings.redis_url)
        for i in range(settings.workers):
            supervisor.add(
                f"worker-{i}", spawn_worker, wait=False, first_backoff_s=settings.restart_backoff_s
            )
        from gateway.api.app import create_app
        from gateway.cli.redis_check import shown_url
        from tenancy import upgrade

        migrate(upgrade, settings.database_url)
        if settings.dev:
            key = _demo_key(settings.database_url)
            base = f"http://{settings.host}:{settings.port}"
            print(
                f"fairlane dev mode\n  admin token:  {settings.admin_token}\n  demo API key: {key}\n"
                f"  OpenAI base URL: {base}/v1   docs: {base}/docs   model: {settings.model_name}\n"
                f"  redis: {shown_url(str(settings.redis_url))}{' (embedded)' if embedded else ''}",
                flush=True,
            )
        spawn_gateway = _gateway_spawner(settings, sock)
        gateways = [f"gateway-{i}" for i in range(1, settings.gateway_workers)]  # this process is gateway 0
        for name in gateways:  # each drains its requests for drain_timeout_s when told to stop
            supervisor.add(
                name,
                spawn_gateway,
                wait=False,
                first_backoff_s=settings.restart_backoff_s,
                stop_timeout_s=settings.drain_timeout_s + GRACE_S,
            )
        log.info(
            "serving on http://%s:%d (%d gateway process(es), %d worker(s))",
            settings.host,
            settings.port,
            settings.gateway_workers,
            settings.workers,
        )
        _serve(
            create_app(settings, supervisor=supervisor),
            sock,
            settings,
            on_stop=lambda: supervisor.stop_now(gateways),
        )
    except Stopping as exc:
        log.info("%s before the gateway was serving: stopping", exc)
    finally:
        for sig in STOP_SIGNALS:  # a second signal must not cut the ordered stop below
            signal.signal(sig, signal.SIG_IGN)
        sock.close()
        log.info("stopping workers%s", " and the embedded Redis" if embedded else "")
        supervisor.stop()
        if embedded is not None:
            embedded.remove()
        multiproc.end(metrics_dir)
    log.info("stopped")
    return 0
