"""Settings of fairlane's processes: FAIRLANE_* environment variables over a YAML file over defaults.

One vocabulary for the whole deployment, one class per process reading its part of it:
``ApiSettings`` (a gateway replica), ``WorkerSettings`` (an engine worker) and ``ServeSettings``
(``fairlane serve``: a replica plus the processes it starts). Every process reads the same
environment and YAML file (FAIRLANE_CONFIG, else configs/fairlane.yaml), so each accepts the keys
of the others and ignores them, and refuses at start any key that belongs to none of them.

The engine is one nested section, built whole into ``engine.EngineConfig`` and derived from that
dataclass: every EngineConfig field is settable, as ``engine: {kv_cache_gib: 2}`` in YAML or
``FAIRLANE_ENGINE__KV_CACHE_GIB=2`` in the environment, with EngineConfig's own defaults and checks.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import parse_qs, urlsplit

from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.dataclasses import dataclass as pydantic_dataclass
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from engine import EngineConfig, parse_policy
from engine.assets import CACHE_ENV
from gateway.settings_sources import (
    ENV_PREFIX,
    NESTED,
    EnvSource,
    OwnYamlSource,
    SettingRefused,
    config_file,
    read_config,
)
from gateway.telemetry import path_marks

# FAIRLANE_* variables that are not settings: read directly by one part of the project, or by clients.
# (Observability also reads the standard OTEL_* variables, e.g. OTEL_EXPORTER_OTLP_ENDPOINT, and
# fairlane serve sets PROMETHEUS_MULTIPROC_DIR for itself and its workers: docs/observability.md.)
NOT_SETTINGS = frozenset(
    {"FAIRLANE_CONFIG", "FAIRLANE_WORKER_ID", CACHE_ENV, "FAIRLANE_API_KEY", path_marks.ENV}
)
NOT_SETTINGS_PREFIX = "FAIRLANE_TEST_"  # the test suite's own
WEAK_ADMIN_TOKENS = frozenset(
    {"", "admin", "changeme", "change-me", "change_me", "secret", "default", "fairlane"}
)
MIN_ADMIN_TOKEN_LEN = 16
# The engine's targets are keyed by engine priority; the server's (same names) by tier name.
SERVER_TARGETS = ("tier_ttft_targets", "tier_tpot_targets")

# EngineConfig itself, validated by pydantic (its __post_init__ checks included); unknown fields refused.
EngineSection = pydantic_dataclass(EngineConfig, frozen=True, config=ConfigDict(extra="forbid"))
ENGINE_FIELDS = frozenset(field.name for field in dataclasses.fields(EngineConfig))
REDIS_SCHEMES = ("redis", "rediss", "unix")  # what redis-py's from_url takes


def redis_url_form(url: str | None) -> str | None:
    """A Redis URL redis-py can use (redis://, rediss:// or unix://; an http:// URL stopped the
    gateway with redis-py's traceback), whose client answers in the reply shapes the lanes and the
    quotas read: redis-py's default or ``protocol=2``. An explicit ``protocol=3`` makes redis-py hand back
    RESP3's own shapes (a stream read as a map, say), which they do not read: refused at start."""
    if url:  # empty: the embedded server
        if urlsplit(url).scheme.lower() not in REDIS_SCHEMES:
            raise ValueError("a Redis URL must start with redis://, rediss:// or unix://")
        for value in parse_qs(urlsplit(url).query).get("protocol", []):
            if value.strip() != "2":
                raise ValueError(
                    f"a Redis URL with protocol={value} is not supported: leave protocol out (or set 2)"
                )
    return url


class SharedSettings(BaseSettings):
    """What every process reads: where Redis is, the model and its engine, the lanes."""

    # hide_input_in_errors: an error names the setting and the rule, never the value (a Redis or
    # database URL's password, the admin token)
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=NESTED,
        extra="forbid",
        frozen=True,
        hide_input_in_errors=True,
    )

    redis_url: str | None = None  # None: `fairlane serve` starts an embedded server
    engine: EngineSection = Field(default_factory=EngineSection)
    served_model_name: str | None = None  # the name clients call the model by (default: from engine.model)
    # Priority lanes, highest first. OpenAI's "auto"/"default" service_tier means the tenant's default.
    tiers: list[str] = Field(default_factory=lambda: ["priority", "standard", "batch"])
    result_ttl_s: int = Field(
        300, ge=1
    )  # out:{id} streams and cancel marks expire this long after last write
    # A gateway on the host of a model's only worker hands it each request over a local socket as
    # the admission queues it, and the idle worker starts its first step before the lane entry
    # reaches it; it publishes nothing until the entry does (gateway/lanes/hints.py). Linux only.
    early_start: bool = True
    # Uploaded LoRA adapters (content-addressed; gateways write, workers read). None: {cache dir}/adapters.
    adapter_dir: str | None = None

    # Observability (docs/observability.md). Tracing is off unless an OTLP endpoint (this, else the
    # standard OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT) or otel_console is set.
    otel_endpoint: str | None = (
        None  # e.g. http://collector:4318 (http/protobuf) or http://collector:4317 (grpc)
    )
    otel_protocol: Literal["http/protobuf", "grpc"] | None = (
        None  # None: OTEL_EXPORTER_OTLP_PROTOCOL, else http
    )
    otel_console: bool = False  # also print every span to stdout (debugging)
    otel_sample_ratio: float = Field(1.0, ge=0, le=1)  # of new traces; a sampled parent is always followed
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["json", "text"] = (
        "json"  # json: one object a line (and one line per finished request)
    )
    metrics_tenant_label: bool = (
        False  # a tenant label on request metrics (one series per tenant: cardinality)
    )

    @property
    def model_name(self) -> str:
        if self.served_model_name:
            return self.served_model_name
        model = self.engine.model
        return Path(model).name if model not in ("smollm2", "dummy") else model

    @property
    def adapter_store_dir(self) -> Path:
        from gateway.adapters.store import default_adapter_dir

        return Path(self.adapter_dir) if self.adapter_dir else default_adapter_dir()

    def engine_config(self) -> EngineConfig:
        """The engine section as the engine's own frozen dataclass."""
        return EngineConfig(**{name: getattr(self.engine, name) for name in ENGINE_FIELDS})

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_level(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    _redis_url = field_validator("redis_url")(redis_url_form)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        check_known_keys()
        return data

    @model_validator(mode="after")
    def _check_shared(self) -> SharedSettings:
        if not self.tiers or len(set(self.tiers)) != len(self.tiers):
            raise ValueError("tiers must be a non-empty list of distinct names")
        for name in SERVER_TARGETS:
            if getattr(self.engine, name):
                raise ValueError(
                    f"engine.{name} is keyed by engine priority; the server sets targets per tier "
                    f"name: use {name} (FAIRLANE_{name.upper()})"
                )
        parse_policy(self.engine.policy)
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, EnvSource(settings_cls)]
        path = config_file()
        if path is not None:
            sources.append(OwnYamlSource(settings_cls, yaml_file=path))
        return tuple(sources)


class WorkerSettings(SharedSettings):
    """An engine worker (``fairlane worker``, or started by ``fairlane serve``)."""

    worker_claim_idle_ms: int = Field(3000, ge=1)  # a lane entry idle this long belongs to a dead worker
    worker_heartbeat_s: float = Field(0.5, gt=0, allow_inf_nan=False)
    # /metrics of a separately started worker (fairlane serve's workers report through its gateway).
    worker_metrics_port: int = Field(9400, ge=0, le=65535)  # 0: no endpoint
    worker_metrics_host: str = "127.0.0.1"

    @model_validator(mode="after")
    def _check_worker(self) -> WorkerSettings:
        # a worker re-claims the entries it runs every heartbeat: an idle bound below two beats
        # makes live workers take each other's (and their own) entries as a dead worker's
        if self.worker_claim_idle_ms < 2000 * self.worker_heartbeat_s:
            raise ValueError(
                f"worker_claim_idle_ms ({self.worker_claim_idle_ms}) must be at least two heartbeats "
                f"(worker_heartbeat_s {self.worker_heartbeat_s}: {2000 * self.worker_heartbeat_s:.0f} ms)"
            )
        return self


class ApiSettings(SharedSettings):
    """A gateway replica. Outside dev mode it refuses an empty or well-known admin token."""

    dev: bool = False
    admin_token: str = ""
    database_url: str = "sqlite:///fairlane.db"
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    max_body_bytes: int = Field(1_000_000, ge=1)
    max_adapter_bytes: int = Field(
        512 << 20, gt=0
    )  # an adapter upload's weights file (its body may be this + 1 MiB)
    max_tokens_default: int = Field(256, ge=1)
    # The replica's Redis connections: its one result reader's blocking XREAD, and one per command
    # in flight (admissions, settlements, cancels) at a time (Redis's own maxclients: 10,000).
    redis_max_connections: int = Field(4096, ge=8)
    # Overload shedding (gateway/api/shedding.py): a generation request over either bound is refused
    # at once with 503 and retry-after shed_retry_after_s, before its quota admission.
    max_inflight_admissions: int = Field(1024, ge=1)  # admitted, waiting for their first results
    redis_pool_shed_fraction: float = Field(0.9, gt=0, le=1)  # of redis_max_connections in use
    shed_retry_after_s: int = Field(1, ge=1)
    request_timeout_s: float = Field(600.0, gt=0)  # the longest wait for a request's first result
    # Once a stream has started: a comment line every sse_keepalive_s while no token comes, and an
    # error event (then the end) when none came for stream_idle_timeout_s.
    sse_keepalive_s: float = Field(5.0, gt=0)
    stream_idle_timeout_s: float = Field(120.0, gt=0)
    # Prompts longer than this (characters of all messages, or of the prompt) are refused before
    # tokenizing; longer ones than tokenize_inline_chars are tokenized in a thread, off the event loop,
    # at most tokenize_threads at a time.
    max_prompt_chars: int = Field(262_144, ge=1)  # 32 characters a token for an 8K context: never fits
    tokenize_inline_chars: int = Field(4096, ge=0)
    tokenize_threads: int = Field(
        1, ge=1
    )  # long prompts tokenized at once; more wait (the loop keeps a core)
    # Prompts of one /v1/completions request (a list of prompts: each its own engine request).
    max_prompts_per_request: int = Field(64, ge=1)
    # Usage records wait this long for others to share their transaction (gateway/api/usage_writer.py);
    # a replica that dies loses the records not written yet. 0: each write starts at once.
    usage_write_linger_s: float = Field(0.02, ge=0, le=5)
    auth_refresh_s: float = 0.25  # how often a replica checks Redis for key/tenant invalidations

    # Latency targets (docs/gateway.md): tier -> seconds; a tenant's own win. They need a "+slo" policy.
    tier_ttft_targets: dict[str, float] = Field(default_factory=dict)
    tier_tpot_targets: dict[str, float] = Field(default_factory=dict)
    slo_gate: bool = True  # refuse at the door what the workers' load says cannot meet its TTFT
    slo_gate_cache_s: float = Field(0.1, ge=0)  # how long a replica reuses its read of the workers' load

    # Quotas (quotas.Limiter on Redis): "closed" refuses requests with a 503 while the quota Redis
    # is unreachable, "open" admits them unchecked (logged).
    quota_on_redis_error: Literal["closed", "open"] = "closed"
    quota_redis_url: str | None = None  # None: the lanes' Redis (redis_url)
    quota_key_prefix: str = "fairlane:quota"  # deployments (or tests) sharing one Redis need their own
    quota_lease_ttl_s: float = Field(900.0, gt=0)  # a concurrency slot outlives a crashed gateway this long

    _quota_redis_url = field_validator("quota_redis_url")(redis_url_form)

    @field_validator("admin_token")
    @classmethod
    def _stripped(cls, token: str) -> str:
        """Without the whitespace around it: a token read from a secret file ends with a newline,
        which no client sends (every admin call was a 401)."""
        return token.strip()

    @model_validator(mode="after")
    def _check_api(self) -> ApiSettings:
        if not self.dev and (
            self.admin_token.strip().lower() in WEAK_ADMIN_TOKENS
            or len(self.admin_token) < MIN_ADMIN_TOKEN_LEN
        ):
            raise ValueError(
                "FAIRLANE_ADMIN_TOKEN must be set to a secret of at least "
                f"{MIN_ADMIN_TOKEN_LEN} characters (or run `fairlane serve --dev`)"
            )
        slo_aware = "slo" in parse_policy(self.engine.policy)
        for name in ("tier_ttft_targets", "tier_tpot_targets"):
            targets = getattr(self, name)
            if set(targets) - set(self.tiers):
                raise ValueError(
                    f"{name} names unknown tiers {sorted(set(targets) - set(self.tiers))}; "
                    f"tiers are {self.tiers}"
                )
            if any(v <= 0 for v in targets.values()):
                raise ValueError(f"{name} must hold positive seconds")
            if targets and not slo_aware:
                raise ValueError(
                    f"{name} are set but policy {self.engine.policy!r} ignores them: add '+slo' "
                    "(e.g. engine.policy 'priority+slo')"
                )
        return self

    def slo_targets(self, tier: str) -> tuple[float | None, float | None]:
        """The tier's (TTFT, TPOT) targets in seconds; None where it has none."""
        return self.tier_ttft_targets.get(tier), self.tier_tpot_targets.get(tier)


class ServeSettings(ApiSettings):
    """``fairlane serve``: a gateway replica, plus the workers (and Redis) it starts."""

    workers: int = Field(1, ge=0)  # engine worker processes to start (0: gateway only)
    # Gateway processes serving the one listening socket (each its own event loop; they share
    # nothing but Redis and the database): up to one per core the engine leaves free.
    gateway_workers: int = Field(1, ge=1)
    # On SIGTERM/SIGINT: in-flight requests get this long to finish before they are cancelled.
    drain_timeout_s: float = Field(30.0, ge=0)
    # A worker or gateway process that dies is started again after this long, doubled at each
    # exit up to restart_backoff_max_s, back to the first once it has run a minute.
    restart_backoff_s: float = Field(1.0, gt=0)
    restart_backoff_max_s: float = Field(30.0, gt=0)

    @model_validator(mode="after")
    def _backoff_in_order(self) -> ServeSettings:
        if self.restart_backoff_max_s < self.restart_backoff_s:
            raise ValueError("restart_backoff_max_s must be at least restart_backoff_s")
        return self


PROCESS_SETTINGS: tuple[type[SharedSettings], ...] = (ApiSettings, WorkerSettings, ServeSettings)
S = TypeVar("S", bound=SharedSettings)


class UnknownSetting(SettingRefused):
    """A FAIRLANE_* variable or a YAML key that no fairlane process reads (the message names the key
    and how to set what was meant)."""


def load_settings(cls: type[S], prog: str, **overrides: Any) -> S:
    """``cls`` from the environment, the YAML file and ``overrides``, or exit naming what is wrong
    in one line (exit status 1)."""
    try:
        return cls(**overrides)
    except SettingRefused as exc:
        raise SystemExit(f"{prog}: {exc}") from None
    except ValidationError as exc:
        raise SystemExit(f"{prog}: {describe_invalid(exc)}") from None


def describe_invalid(exc: ValidationError) -> str:
    """Each error as the setting it is about and the rule, on one line (never the value)."""
    parts = []
    for error in exc.errors():
        loc = ".".join(str(part) for part in error["loc"])
        rule = str(error["msg"]).splitlines()[0].removeprefix("Value error, ")
        parts.append(f"invalid setting {loc}: {rule}" if loc else f"invalid settings: {rule}")
    return "; ".join(parts)


def known_keys() -> frozenset[str]:
    """Every top-level setting of every process."""
    return frozenset(name for cls in PROCESS_SETTINGS for name in cls.model_fields)


def check_known_keys(environ: dict[str, str] | None = None, path: Path | None = None) -> None:
    """Raise UnknownSetting naming the first FAIRLANE_* variable or YAML key no process reads."""
    environ = os.environ if environ is None else environ
    path = config_file() if path is None else path
    keys = known_keys()
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or upper in NOT_SETTINGS or upper.startswith(NOT_SETTINGS_PREFIX):
            continue
        key = upper[len(ENV_PREFIX) :].lower()
        if key in keys:
            continue
        section, _, field = key.partition(NESTED)
        if section == "engine" and field in ENGINE_FIELDS:
            continue
        raise UnknownSetting(f"unknown setting {name}; {_hint(key, env=True)}")
    if path is None:
        return
    for key, value in read_config(path).items():
        if key not in keys:
            raise UnknownSetting(f"unknown key {key!r} in {path}; {_hint(str(key), env=False)}")
        if key == "engine" and isinstance(value, dict):
            for field in value:
                if field not in ENGINE_FIELDS:
                    raise UnknownSetting(
                        f"unknown key 'engine.{field}' in {path}; EngineConfig's fields are "
                        f"{', '.join(sorted(ENGINE_FIELDS))}"
                    )


def _hint(key: str, *, env: bool) -> str:
    if key in ENGINE_FIELDS:
        return (
            f"engine fields are set as FAIRLANE_ENGINE__{key.upper()}"
            if env
            else f"engine fields go in the engine section: 'engine: {{{key}: ...}}'"
        )
    if key.startswith(f"engine{NESTED}"):
        return f"EngineConfig's fields are {', '.join(sorted(ENGINE_FIELDS))}"
    close = difflib.get_close_matches(key, sorted(known_keys() | ENGINE_FIELDS), n=1)
    if close:
        name = close[0] if close[0] not in ENGINE_FIELDS else f"engine{NESTED if env else '.'}{close[0]}"
        return f"did you mean {('FAIRLANE_' + name.upper()) if env else repr(name)}?"
    return f"settings are {', '.join(sorted(known_keys()))} and engine.<EngineConfig field>"
