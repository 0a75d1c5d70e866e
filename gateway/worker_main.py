"""The engine worker process: ``python -m gateway.worker_main`` (started by ``fairlane serve``).

Builds the engine from Settings, beats a heartbeat (which also keeps its lane entries claimed so no
other worker mistakes them for a dead worker's) and runs the Worker loop until SIGTERM/SIGINT.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import uuid

import redis as redislib
from pydantic import ValidationError

from engine import Engine, EngineConfig
from gateway.lanes import GROUP, WORKER_ALIVE_S, model_info_key, worker_info_key, workers_key
from gateway.settings import Settings
from gateway.worker import Worker

log = logging.getLogger("fairlane.worker")


def build_engine(settings: Settings) -> Engine:
    """The worker's engine. Latency targets are not set here: each request carries its own (the
    gateway resolves tenant and tier targets), so that a resumed request can go without one."""
    return Engine(EngineConfig(
        model=settings.model, dtype=settings.dtype, num_threads=settings.num_threads,
        max_num_seqs=settings.max_num_seqs, max_num_batched_tokens=settings.max_num_batched_tokens,
        block_size=settings.block_size, num_kv_blocks=settings.num_kv_blocks,
        max_model_len=settings.max_model_len, dummy_config=settings.dummy_config,
        policy=settings.policy, slo_demote=settings.slo_demote,
    ))


def heartbeat(worker: Worker, redis: redislib.Redis, settings: Settings, stop: threading.Event) -> None:
    """Every heartbeat period: announce this worker and re-claim its running entries (resets idle)."""
    model = settings.model_name
    while not stop.wait(settings.worker_heartbeat_s):
        try:
            now = time.time()
            pipe = redis.pipeline(transaction=False)
            pipe.zadd(workers_key(model), {worker.worker_id: now})
            pipe.zremrangebyscore(workers_key(model), "-inf", now - 10 * WORKER_ALIVE_S)
            pipe.hset(model_info_key(model), "max_model_len", worker.engine.max_model_len)
            info = worker_info_key(model, worker.worker_id)
            pipe.hset(info, mapping={"free_blocks": worker.engine.num_free_blocks,
                                     "total_blocks": worker.engine.num_total_blocks,
                                     "running": len(worker.inflight)})
            pipe.expire(info, int(WORKER_ALIVE_S))
            for lane, ids in worker.owned_entries().items():
                pipe.xclaim(lane, GROUP, worker.worker_id, 0, ids, justid=True)
            pipe.execute()
        except redislib.RedisError as exc:  # keep beating; the main loop reports persistent failures
            log.warning("heartbeat failed: %s", exc)


def main(overrides: dict | None = None) -> None:
    logging.basicConfig(level=os.environ.get("FAIRLANE_LOG_LEVEL", "INFO"),
                        format="%(asctime)s worker %(levelname)s %(message)s")
    try:
        settings = Settings(**(overrides or {}))
    except ValidationError as exc:
        raise SystemExit(f"fairlane worker: invalid settings:\n{exc}") from None
    if not settings.redis_url:
        raise SystemExit("the worker needs FAIRLANE_REDIS_URL")
    worker_id = os.environ.get("FAIRLANE_WORKER_ID") or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    engine = build_engine(settings)
    redis = redislib.Redis.from_url(settings.redis_url)
    worker = Worker(engine, redis, model=settings.model_name, tiers=settings.tiers, worker_id=worker_id,
                    result_ttl_s=settings.result_ttl_s, claim_idle_ms=settings.worker_claim_idle_ms)
    worker.setup()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    beat = threading.Thread(target=heartbeat, args=(worker, redis, settings, stop), daemon=True)
    beat.start()
    log.info("worker %s serving %s (max_model_len %d, %d KV blocks, policy %s)", worker_id, settings.model_name,
             engine.max_model_len, engine.num_total_blocks, settings.policy)
    print(f"fairlane worker {worker_id} ready", flush=True)
    try:
        worker.run(stop)
    finally:
        stop.set()
        try:
            redis.zrem(workers_key(settings.model_name), worker_id)
            worker.withdraw_load()
        except redislib.RedisError:  # Redis may be going down with us (fairlane serve, Ctrl-C)
            pass


if __name__ == "__main__":
    main()
