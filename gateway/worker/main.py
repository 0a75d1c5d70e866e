"""The engine worker process: ``python -m gateway.worker`` (``fairlane worker``; ``fairlane serve``
starts them). Builds the engine from the settings' engine section, beats a heartbeat and runs the
Worker loop until SIGTERM/SIGINT.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import uuid

import redis as redislib
from prometheus_client import start_http_server

from engine import Engine, calibrate
from gateway.lanes import hints
from gateway.lanes.connect import sync_client
from gateway.lanes.keys import workers_key
from gateway.settings import WorkerSettings, load_settings
from gateway.telemetry import gc_policy
from gateway.telemetry.logs import setup_logging
from gateway.telemetry.metrics import multiprocess_dir
from gateway.telemetry.tracing import setup_tracing, shutdown_tracing
from gateway.worker.heartbeat import heartbeat
from gateway.worker.loop import Worker

log = logging.getLogger("fairlane.worker")


def build_engine(settings: WorkerSettings) -> Engine:
    """The worker's engine. Latency targets are not set here: each request carries its own (the
    gateway resolves tenant and tier targets), so that a resumed request can go without one."""
    return Engine(settings.engine_config())


def serve_metrics(settings: WorkerSettings) -> None:
    """A separately started worker serves /metrics on ``worker_metrics_port`` (0: none). Under
    ``fairlane serve`` (PROMETHEUS_MULTIPROC_DIR set) its metrics are on the gateway's /metrics."""
    if multiprocess_dir() or not settings.worker_metrics_port:
        return
    try:
        start_http_server(settings.worker_metrics_port, addr=settings.worker_metrics_host)
    except OSError as exc:
        raise SystemExit(
            f"fairlane worker: cannot serve metrics on {settings.worker_metrics_host}:"
            f"{settings.worker_metrics_port} ({exc}); set FAIRLANE_WORKER_METRICS_PORT "
            "(0: no endpoint)"
        ) from exc
    log.info("metrics on http://%s:%d/metrics", settings.worker_metrics_host, settings.worker_metrics_port)


def worker_id() -> str:
    return (
        os.environ.get("FAIRLANE_WORKER_ID") or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    )


def main(engine_overrides: dict | None = None) -> None:
    """Run one worker; ``engine_overrides`` (e.g. ``{"policy": ...}`` from the CLI) win over the settings."""
    overrides = {"engine": engine_overrides} if engine_overrides else {}
    settings = load_settings(WorkerSettings, "fairlane worker", **overrides)
    setup_logging(settings, "worker")
    if not settings.redis_url:
        raise SystemExit("fairlane worker: set FAIRLANE_REDIS_URL")
    serve_metrics(settings)
    traced = setup_tracing(settings, "fairlane-worker")
    name = worker_id()
    try:
        engine = build_engine(settings)
    except Exception as exc:  # a model it cannot load: one line, not a traceback on each restart
        log.debug("the engine's start failed", exc_info=True)
        log.error("cannot load model %r: %s: %s", settings.engine.model, type(exc).__name__, exc)
        raise SystemExit(1) from None
    calibrate(engine)  # the step-cost models from this machine's steps, not the prior (engine/calibrate.py)
    step_s, prefill_s, decode_s = engine.scheduler.step_cost.theta
    log.info(
        "step cost: %.2f ms + %.4f ms a prompt token + %.3f ms a decoding sequence",
        1e3 * step_s,
        1e3 * prefill_s,
        1e3 * decode_s,
    )
    redis = sync_client(settings.redis_url)
    worker = Worker(
        engine,
        redis,
        model=settings.model_name,
        tiers=settings.tiers,
        worker_id=name,
        result_ttl_s=settings.result_ttl_s,
        claim_idle_ms=settings.worker_claim_idle_ms,
        adapter_dir=settings.adapter_store_dir,
        inbox=hints.open_inbox() if settings.early_start else None,
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    beat = threading.Thread(
        target=heartbeat,
        args=(worker, redis, stop),
        kwargs={"every_s": settings.worker_heartbeat_s},
        daemon=True,
    )
    beat.start()
    log.info(
        "worker %s serving %s (max_model_len %d, %d KV blocks, policy %s)",
        name,
        settings.model_name,
        engine.max_model_len,
        engine.num_total_blocks,
        settings.engine.policy,
    )
    print(f"fairlane worker {name} ready", flush=True)
    gc_policy.freeze()  # the model and the imports: out of every later collection (a step in flight)
    try:
        worker.run(stop)
    finally:
        stop.set()
        try:
            redis.zrem(workers_key(settings.model_name), name)
            worker.withdraw_load()
        except (redislib.RedisError, OSError):  # Redis may be going down with us (fairlane serve)
            pass
        if worker.inbox is not None:
            worker.inbox.close()
        if traced:
            shutdown_tracing()  # exports the spans still queued
