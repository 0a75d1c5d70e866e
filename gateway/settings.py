"""Gateway settings: FAIRLANE_* environment variables over a YAML file over defaults.

The YAML file is FAIRLANE_CONFIG if set, else configs/fairlane.yaml (the embedded default).
A server that is not in dev mode refuses to start with an empty or well-known admin token.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, YamlConfigSettingsSource

DEFAULT_CONFIG_FILE = Path(__file__).resolve().parent.parent / "configs" / "fairlane.yaml"
WEAK_ADMIN_TOKENS = frozenset({"", "admin", "changeme", "change-me", "change_me", "secret", "default", "fairlane"})
MIN_ADMIN_TOKEN_LEN = 16
POLICY_PARTS = ("fcfs", "priority", "vtc", "slo")  # engine scheduling policies compose with "+"


def config_file() -> Path | None:
    path = Path(os.environ.get("FAIRLANE_CONFIG", DEFAULT_CONFIG_FILE))
    return path if path.is_file() else None


class Settings(BaseSettings):
    """Everything a gateway, a worker and `fairlane serve` read; one instance per process."""

    model_config = SettingsConfigDict(env_prefix="FAIRLANE_", extra="ignore", frozen=True)

    dev: bool = False
    admin_token: str = ""
    database_url: str = "sqlite:///fairlane.db"
    redis_url: str | None = None  # None: `fairlane serve` starts an embedded server

    # The model every worker of this deployment serves, and the name clients call it by.
    model: str = "smollm2"
    served_model_name: str | None = None
    dtype: str = "float32"
    num_threads: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    block_size: int = 16
    num_kv_blocks: int | None = None
    max_model_len: int | None = None
    dummy_config: dict[str, Any] | None = None

    # Priority lanes, highest first. OpenAI's "auto"/"default" service_tier means the tenant's default.
    tiers: list[str] = Field(default_factory=lambda: ["priority", "standard", "batch"])

    # Scheduling (docs/scheduling.md): the engine policy of every worker; "+slo" turns on SLO-aware
    # admission, which acts on the latency targets below (tier -> seconds; a tenant's own win).
    policy: str = "fcfs"
    tier_ttft_targets: dict[str, float] = Field(default_factory=dict)
    tier_tpot_targets: dict[str, float] = Field(default_factory=dict)
    slo_demote: bool = False  # a request that would miss its TTFT target drops a tier instead of a 503
    slo_gate: bool = True  # gateways refuse at the door what the workers' load says cannot meet its TTFT
    slo_gate_cache_s: float = Field(0.1, ge=0)  # how long a gateway reuses its read of the workers' load

    host: str = "127.0.0.1"
    port: int = 8000
    workers: int = 1  # engine worker processes started by `fairlane serve`
    max_body_bytes: int = 1_000_000
    max_tokens_default: int = 256
    request_timeout_s: float = 600.0
    result_ttl_s: int = 300  # out:{id} streams and cancel marks expire this long after last write
    auth_refresh_s: float = 0.25  # how often a replica checks Redis for key/tenant invalidations
    worker_claim_idle_ms: int = 3000  # a lane entry idle this long belongs to a dead worker
    worker_heartbeat_s: float = 0.5

    # Quotas (quotas.Limiter on Redis): "closed" refuses requests with a 503 while the quota Redis
    # is unreachable, "open" admits them unchecked (logged).
    quota_on_redis_error: Literal["closed", "open"] = "closed"
    quota_redis_url: str | None = None  # None: the lanes' Redis (redis_url)
    quota_key_prefix: str = "fairlane:quota"  # deployments (or tests) sharing one Redis need their own
    quota_lease_ttl_s: float = Field(900.0, gt=0)  # a concurrency slot outlives a crashed gateway this long

    @property
    def model_name(self) -> str:
        if self.served_model_name:
            return self.served_model_name
        return Path(self.model).name if self.model not in ("smollm2", "dummy") else self.model

    @model_validator(mode="after")
    def _check(self) -> Settings:
        if not self.dev and (
            self.admin_token.strip().lower() in WEAK_ADMIN_TOKENS or len(self.admin_token) < MIN_ADMIN_TOKEN_LEN
        ):
            raise ValueError(
                "FAIRLANE_ADMIN_TOKEN must be set to a secret of at least "
                f"{MIN_ADMIN_TOKEN_LEN} characters (or run `fairlane serve --dev`)"
            )
        if not self.tiers or len(set(self.tiers)) != len(self.tiers):
            raise ValueError("tiers must be a non-empty list of distinct names")
        parts = self.policy.split("+")
        unknown = [p for p in parts if p not in POLICY_PARTS]
        if unknown:
            raise ValueError(f"unknown scheduling policy {self.policy!r}: compose {', '.join(POLICY_PARTS)} "
                             "with '+', e.g. 'priority+vtc+slo'")
        for name in ("tier_ttft_targets", "tier_tpot_targets"):
            targets = getattr(self, name)
            if set(targets) - set(self.tiers):
                raise ValueError(f"{name} names unknown tiers {sorted(set(targets) - set(self.tiers))}; "
                                 f"tiers are {self.tiers}")
            if any(v <= 0 for v in targets.values()):
                raise ValueError(f"{name} must hold positive seconds")
            if targets and "slo" not in parts:
                raise ValueError(f"{name} are set but policy {self.policy!r} ignores them: add '+slo' "
                                 "(e.g. 'priority+slo')")
        return self

    def slo_targets(self, tier: str) -> tuple[float | None, float | None]:
        """The tier's (TTFT, TPOT) targets in seconds; None where it has none."""
        return self.tier_ttft_targets.get(tier), self.tier_tpot_targets.get(tier)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        path = config_file()
        if path is not None:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=path))
        return tuple(sources)
