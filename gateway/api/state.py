"""What one gateway replica holds while it runs: connections, tokenizer, caches (nothing shared)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import anyio
import redis.asyncio as aioredis
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from engine import check_model
from gateway.api.auth import KeyCache
from gateway.api.quota_service import QuotaService
from gateway.api.shedding import AdmissionBound
from gateway.api.slo_gate import SLOGate
from gateway.api.tokenization import PromptTokenizer, load_prompt_tokenizer
from gateway.api.usage_writer import UsageWriter
from gateway.lanes.client import LaneClient
from gateway.lanes.connect import async_client
from gateway.lanes.keys import model_info_key
from gateway.settings import ApiSettings, ServeSettings
from tenancy import make_engine, make_session_factory

log = logging.getLogger(__name__)
MODEL_INFO_TTL_S = 5.0  # a replica re-reads the context its workers announce this often


@dataclass
class GatewayState:
    settings: ApiSettings
    redis: aioredis.Redis
    db_engine: Engine
    session_factory: sessionmaker[Session]
    tokenizer: PromptTokenizer
    lanes: LaneClient
    key_cache: KeyCache
    quota_service: QuotaService
    slo_gate: SLOGate
    tokenize_limiter: anyio.CapacityLimiter  # threads tokenizing long prompts
    admissions: AdmissionBound  # admissions in flight, and the bound that sheds requests over it
    usage: UsageWriter  # the usage records, in batches
    _max_model_len: int | None = None
    _model_info_at: float = field(default=float("-inf"))

    @classmethod
    def open(cls, settings: ApiSettings) -> GatewayState:
        """Check the model, connect to Redis and the database and load the tokenizer (blocking: run
        at startup). A checkpoint the engine cannot serve exactly stops the gateway here
        (UnsupportedModelError), before it answers anything."""
        if not settings.redis_url:
            raise RuntimeError("the gateway needs FAIRLANE_REDIS_URL (fairlane serve sets it)")
        check_model(settings.engine.model)
        redis = async_client(settings.redis_url, max_connections=settings.redis_max_connections)
        db_engine = make_engine(settings.database_url)
        session_factory = make_session_factory(db_engine)
        return cls(
            settings=settings,
            redis=redis,
            db_engine=db_engine,
            session_factory=session_factory,
            tokenizer=load_prompt_tokenizer(settings.engine.model, dummy_config=settings.engine.dummy_config),
            lanes=LaneClient(
                redis,
                result_ttl_s=settings.result_ttl_s,
                early_start=settings.early_start,
                # with several gateway processes a client's next request may reach another one
                result_echoes=not isinstance(settings, ServeSettings) or settings.gateway_workers == 1,
            ),
            key_cache=KeyCache(session_factory, redis, refresh_s=settings.auth_refresh_s),
            quota_service=QuotaService.open(settings, session_factory),
            slo_gate=SLOGate(
                redis, model=settings.model_name, tiers=settings.tiers, cache_s=settings.slo_gate_cache_s
            ),
            tokenize_limiter=anyio.CapacityLimiter(settings.tokenize_threads),
            admissions=AdmissionBound(
                redis,
                max_inflight=settings.max_inflight_admissions,
                pool_fraction=settings.redis_pool_shed_fraction,
                retry_after_s=settings.shed_retry_after_s,
            ),
            usage=UsageWriter(session_factory, linger_s=settings.usage_write_linger_s),
        )

    async def close(self) -> None:
        """Close every part, each one even when another fails: a Redis client whose server stalls
        with a command half sent raises from its close (redis-py's "Timed out closing connection
        after 0.5", the quota client's connect timeout), which must neither leave the other
        connections open nor fail the shutdown."""
        parts = {
            "usage": self.usage.aclose,
            "lanes": self.lanes.aclose,
            "quotas": self.quota_service.aclose,
            "redis": self.redis.aclose,
        }
        for name, close in parts.items():
            try:
                await close()
            except Exception as exc:
                log.warning("closing the gateway's %s client: %s", name, exc)
        self.db_engine.dispose()

    async def max_model_len(self) -> int | None:
        """The served model's context as its workers announce it (refreshed every few seconds)."""
        now = time.monotonic()
        if self._max_model_len is None or now - self._model_info_at > MODEL_INFO_TTL_S:
            value = await self.redis.hget(model_info_key(self.settings.model_name), "max_model_len")
            self._max_model_len = int(value) if value is not None else None
            self._model_info_at = now
        return self._max_model_len
