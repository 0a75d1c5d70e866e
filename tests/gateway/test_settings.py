"""Settings: environment over YAML over defaults, one class per process, the engine section built
whole into EngineConfig, unknown keys refused by name, weak admin tokens refused outside dev."""

from __future__ import annotations

import dataclasses

import pytest
from pydantic import ValidationError

from engine import EngineConfig
from gateway.settings import (
    ApiSettings,
    ServeSettings,
    UnknownSetting,
    WorkerSettings,
    check_known_keys,
    load_settings,
)

STRONG = "a-strong-admin-token-1234567890"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    import os

    for name in list(os.environ):
        if name.startswith("FAIRLANE_") and not name.startswith("FAIRLANE_TEST_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("FAIRLANE_CONFIG", "")


def _yaml(monkeypatch, tmp_path, text: str) -> None:
    config = tmp_path / "fairlane.yaml"
    config.write_text(text)
    monkeypatch.setenv("FAIRLANE_CONFIG", str(config))


def test_a_config_file_named_but_missing_stops_the_start(monkeypatch, tmp_path):
    """A typo in FAIRLANE_CONFIG's path used to start with every setting at its default."""
    monkeypatch.setenv("FAIRLANE_CONFIG", str(tmp_path / "txet.yaml"))
    with pytest.raises(SystemExit, match="which is not a file"):
        load_settings(WorkerSettings, "fairlane worker")
    monkeypatch.setenv("FAIRLANE_CONFIG", str(tmp_path))  # a folder is no file either
    with pytest.raises(SystemExit, match="which is not a file"):
        load_settings(WorkerSettings, "fairlane worker")
    monkeypatch.setenv("FAIRLANE_CONFIG", "")  # empty: no file, by choice
    assert WorkerSettings().worker_heartbeat_s == 0.5


@pytest.mark.parametrize("token", ["", "changeme", "admin", "short"])
def test_weak_admin_token_is_refused(monkeypatch, token):
    monkeypatch.setenv("FAIRLANE_ADMIN_TOKEN", token)
    with pytest.raises(ValidationError, match="FAIRLANE_ADMIN_TOKEN"):
        ApiSettings()


def test_the_admin_token_is_read_without_the_newline_a_secret_file_ends_with(monkeypatch):
    monkeypatch.setenv("FAIRLANE_ADMIN_TOKEN", STRONG + "\n")
    assert ApiSettings().admin_token == STRONG
    monkeypatch.setenv("FAIRLANE_ADMIN_TOKEN", "  short  \n")
    with pytest.raises(ValidationError):  # and a short one padded to length is still short
        ApiSettings()


def test_dev_mode_allows_an_empty_token():
    assert ApiSettings(dev=True).admin_token == ""


def test_a_worker_needs_no_admin_token():
    assert WorkerSettings().worker_heartbeat_s == 0.5


def test_env_overrides_yaml_which_overrides_defaults(monkeypatch, tmp_path):
    _yaml(
        monkeypatch,
        tmp_path,
        "engine: {model: dummy, max_num_seqs: 8, kv_cache_gib: 2}\nport: 9001\n"
        "tiers: [gold, silver]\nworkers: 3\nworker_heartbeat_s: 0.2\n",
    )
    monkeypatch.setenv("FAIRLANE_ADMIN_TOKEN", STRONG)
    monkeypatch.setenv("FAIRLANE_PORT", "9002")
    monkeypatch.setenv("FAIRLANE_ENGINE__MAX_NUM_SEQS", "12")
    settings = ApiSettings()  # the keys of other processes (workers, worker_heartbeat_s) are theirs
    assert (settings.engine.model, settings.port, settings.tiers) == ("dummy", 9002, ["gold", "silver"])
    assert (settings.engine.max_num_seqs, settings.engine.kv_cache_gib) == (
        12,
        2.0,
    )  # env over YAML, per field
    assert settings.engine.block_size == EngineConfig.block_size  # EngineConfig's own default
    assert WorkerSettings().worker_heartbeat_s == 0.2 and ServeSettings().workers == 3


def test_the_engine_section_builds_engine_config_whole():
    """Every EngineConfig field is settable, with the engine's defaults (dtype auto included)."""
    changed = {
        "kv_cache_gib": 0.5,
        "preemption_mode": "swap",
        "watermark": 0.05,
        "attention_backend": "torch",
        "isolate_urgent_prefill": False,
        "cost_step_s": 0.02,
        "seed": 7,
        "dummy_config": {"vocab_size": 64},
    }
    config = ApiSettings(dev=True, engine=changed).engine_config()
    assert type(config) is EngineConfig
    assert config == dataclasses.replace(EngineConfig(), **changed)
    assert ApiSettings(dev=True).engine_config() == EngineConfig() and EngineConfig().dtype == "auto"


def test_engine_fields_from_the_environment(monkeypatch):
    monkeypatch.setenv("FAIRLANE_ENGINE__DUMMY_CONFIG", '{"vocab_size": 64}')
    monkeypatch.setenv("FAIRLANE_ENGINE__NUM_KV_BLOCKS", "32")
    monkeypatch.setenv("FAIRLANE_ENGINE__ENABLE_PREFIX_CACHING", "false")
    config = WorkerSettings().engine_config()
    assert (config.dummy_config, config.num_kv_blocks, config.enable_prefix_caching) == (
        {"vocab_size": 64},
        32,
        False,
    )


@pytest.mark.parametrize(
    "engine, match",
    [
        ({"block_size": 3}, "power of two"),  # EngineConfig's own check
        ({"dtype": "int8"}, "dtype must be one of"),
        ({"policy": "priority+fair"}, r"unknown part\(s\) \['fair'\]"),  # the engine's policy registry
        ({"tier_ttft_targets": {3: 0.5}}, "use tier_ttft_targets"),
    ],
)
def test_bad_engine_settings_are_refused(engine, match):
    with pytest.raises(ValidationError, match=match):
        WorkerSettings(engine=engine)


def test_an_unknown_environment_variable_is_named(monkeypatch):
    monkeypatch.setenv("FAIRLANE_KV_CACHE_GIB", "2")
    with pytest.raises(
        UnknownSetting,
        match="unknown setting FAIRLANE_KV_CACHE_GIB; engine fields are set as FAIRLANE_ENGINE__KV_CACHE_GIB",
    ):
        WorkerSettings()
    monkeypatch.delenv("FAIRLANE_KV_CACHE_GIB")
    monkeypatch.setenv("FAIRLANE_ENGINE__KV_CACHE", "2")
    with pytest.raises(UnknownSetting, match="FAIRLANE_ENGINE__KV_CACHE;"):
        ApiSettings(dev=True)
    monkeypatch.delenv("FAIRLANE_ENGINE__KV_CACHE")
    monkeypatch.setenv("FAIRLANE_PORTS", "1")
    with pytest.raises(UnknownSetting, match="FAIRLANE_PORTS; did you mean FAIRLANE_PORT"):
        ServeSettings(dev=True)


def test_variables_that_are_not_settings_are_left_alone():
    check_known_keys(
        {
            "FAIRLANE_CONFIG": "x",
            "FAIRLANE_LOG_LEVEL": "DEBUG",
            "FAIRLANE_WORKER_ID": "w",
            "FAIRLANE_CACHE_DIR": "/tmp",
            "FAIRLANE_API_KEY": "fl-x",
            "FAIRLANE_TEST_ANYTHING": "1",
            "FAIRLANE_ENGINE": "{}",
            "FAIRLANE_WORKERS": "2",
            "HOME": "/root",
        }
    )


@pytest.mark.parametrize(
    "text, match",
    [
        ("kv_cache_gib: 2\n", "unknown key 'kv_cache_gib' in .*engine: {kv_cache_gib: ...}"),
        ("engine: {kv_cache: 2}\n", "unknown key 'engine.kv_cache'"),
        ("prot: 80\n", "unknown key 'prot'.*did you mean 'port'"),
    ],
)
def test_an_unknown_yaml_key_is_named(monkeypatch, tmp_path, text, match):
    _yaml(monkeypatch, tmp_path, text)
    with pytest.raises(UnknownSetting, match=match):
        WorkerSettings()


def test_embedded_default_yaml_is_valid(monkeypatch):
    monkeypatch.delenv("FAIRLANE_CONFIG")
    settings = ServeSettings(admin_token=STRONG)
    assert settings.engine.model == "smollm2" and settings.tiers == ["priority", "standard", "batch"]
    assert settings.engine.dtype == "auto" and WorkerSettings().engine == settings.engine


def test_tiers_must_be_distinct():
    with pytest.raises(ValidationError, match="tiers"):
        ApiSettings(admin_token=STRONG, tiers=["a", "a"])


def test_model_name_defaults_to_the_model_or_folder_name():
    assert ApiSettings(dev=True, engine={"model": "/models/My-Model"}).model_name == "My-Model"
    assert ApiSettings(dev=True, engine={"model": "dummy"}, served_model_name="tiny").model_name == "tiny"


def test_slo_settings_from_yaml_and_env(monkeypatch, tmp_path):
    _yaml(
        monkeypatch,
        tmp_path,
        "engine: {policy: priority+vtc+slo}\ntier_ttft_targets: {priority: 0.5, standard: 2}\n",
    )
    monkeypatch.setenv("FAIRLANE_TIER_TPOT_TARGETS", '{"priority": 0.05}')
    settings = ApiSettings(admin_token=STRONG)
    assert settings.engine.policy == "priority+vtc+slo"
    assert settings.tier_ttft_targets == {"priority": 0.5, "standard": 2.0}
    assert settings.slo_targets("priority") == (0.5, 0.05) and settings.slo_targets("batch") == (None, None)
    assert settings.slo_gate and not settings.engine.slo_demote


@pytest.mark.parametrize(
    "fields, match",
    [
        ({"engine": {"policy": "priority+slo"}, "tier_ttft_targets": {"gold": 1.0}}, "unknown tiers"),
        ({"engine": {"policy": "priority+slo"}, "tier_tpot_targets": {"batch": 0}}, "positive seconds"),
        ({"engine": {"policy": "priority"}, "tier_ttft_targets": {"priority": 1.0}}, r"add '\+slo'"),
    ],
)
def test_bad_slo_settings_are_refused(fields, match):
    with pytest.raises(ValidationError, match=match):
        ApiSettings(admin_token=STRONG, **fields)


# Values that started a server on which every request hung, failed or was cut to one token, or a
# worker that spun: refused at start.
@pytest.mark.parametrize(
    "cls, fields",
    [
        (ApiSettings, {"result_ttl_s": 0}),
        (ApiSettings, {"max_tokens_default": 0}),
        (ApiSettings, {"max_body_bytes": 0}),
        (ApiSettings, {"port": 65537}),
        (ApiSettings, {"port": 0}),
        (WorkerSettings, {"worker_heartbeat_s": 0}),
        (WorkerSettings, {"worker_claim_idle_ms": -1}),
        (WorkerSettings, {"worker_claim_idle_ms": 900, "worker_heartbeat_s": 0.5}),  # under two beats
    ],
)
def test_values_no_server_can_run_with_are_refused(cls, fields):
    with pytest.raises(ValidationError):
        cls(admin_token=STRONG, **fields) if cls is ApiSettings else cls(**fields)


@pytest.mark.parametrize("field", ["redis_url", "quota_redis_url"])
def test_a_redis_url_asking_for_resp3_shapes_is_refused(field):
    """redis-py hands back RESP3's own reply shapes only when the URL asks for protocol=3; the
    lanes read stream replies in RESP2's (a worker's wait would fail on the first entry)."""
    with pytest.raises(ValidationError, match="protocol=3 is not supported"):
        ApiSettings(dev=True, **{field: "redis://127.0.0.1:6379/0?protocol=3"})
    urls = ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0?protocol=2", "unix:///tmp/r.sock?db=1", "")
    for url in urls:  # empty: the embedded server
        assert getattr(ApiSettings(dev=True, **{field: url}), field) == url
    with pytest.raises(ValidationError, match="protocol=3 is not supported"):
        WorkerSettings(redis_url="redis://127.0.0.1:6379/0?db=0&protocol=3")
    # the error a start prints names the setting, not its value: the URL's password stays out
    with pytest.raises(SystemExit) as refused:
        load_settings(
            WorkerSettings, "fairlane worker", redis_url="redis://:s3cret@127.0.0.1:6379/0?protocol=3"
        )
    assert "protocol=3 is not supported" in str(refused.value) and "s3cret" not in str(refused.value)


# Each printed a traceback (redis-py's, PyYAML's, pydantic-settings') instead of one line.
@pytest.mark.parametrize(
    "env, yaml_text, says",
    [
        ({"FAIRLANE_REDIS_URL": "http://u:s3cret@127.0.0.1:6379/0"}, None, "setting redis_url: a Redis URL"),
        ({"FAIRLANE_QUOTA_REDIS_URL": "http://127.0.0.1:6379/0"}, None, "setting quota_redis_url: a Redis"),
        ({}, "port: [1\n  bad: : x\n", "fairlane.yaml is not valid YAML: expected ',' or ']'"),
        ({}, "- port\n- 80\n", "fairlane.yaml must hold a mapping of settings, not a list"),
        ({"FAIRLANE_TIERS": "gold"}, None, "FAIRLANE_TIERS must be JSON"),
        ({"FAIRLANE_TIER_TTFT_TARGETS": "gold=1"}, None, "FAIRLANE_TIER_TTFT_TARGETS must be JSON"),
    ],
)
def test_settings_that_cannot_be_read_stop_the_start_in_one_line(monkeypatch, tmp_path, env, yaml_text, says):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if yaml_text is not None:
        _yaml(monkeypatch, tmp_path, yaml_text)
    with pytest.raises(SystemExit) as refused:
        load_settings(ServeSettings, "fairlane serve", dev=True)
    message = str(refused.value)
    assert message.startswith("fairlane serve: ") and says in message
    assert "\n" not in message and "s3cret" not in message


def test_every_invalid_setting_is_named_on_one_line():
    with pytest.raises(SystemExit) as refused:
        load_settings(ServeSettings, "fairlane serve", dev=True, port=0, result_ttl_s=0)
    assert str(refused.value) == (
        "fairlane serve: invalid setting result_ttl_s: Input should be greater than or equal to 1; "
        "invalid setting port: Input should be greater than or equal to 1"
    )


def test_restart_backoffs_are_positive_and_in_order():
    settings = ServeSettings(dev=True, restart_backoff_s=0.2, restart_backoff_max_s=5)
    assert (settings.restart_backoff_s, settings.restart_backoff_max_s) == (0.2, 5)
    with pytest.raises(ValidationError, match="restart_backoff_max_s must be at least restart_backoff_s"):
        ServeSettings(dev=True, restart_backoff_s=2, restart_backoff_max_s=1)
    with pytest.raises(ValidationError, match="restart_backoff_s"):
        ServeSettings(dev=True, restart_backoff_s=0)
