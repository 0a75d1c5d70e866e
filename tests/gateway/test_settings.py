"""Settings: environment over YAML over defaults; weak admin tokens refused outside dev."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gateway.settings import Settings

STRONG = "a-strong-admin-token-1234567890"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    for name in ("FAIRLANE_ADMIN_TOKEN", "FAIRLANE_DEV", "FAIRLANE_MODEL", "FAIRLANE_PORT", "FAIRLANE_TIERS",
                 "FAIRLANE_POLICY", "FAIRLANE_TIER_TTFT_TARGETS", "FAIRLANE_TIER_TPOT_TARGETS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FAIRLANE_CONFIG", str(tmp_path / "absent.yaml"))


@pytest.mark.parametrize("token", ["", "changeme", "admin", "short"])
def test_weak_admin_token_is_refused(monkeypatch, token):
    monkeypatch.setenv("FAIRLANE_ADMIN_TOKEN", token)
    with pytest.raises(ValidationError, match="FAIRLANE_ADMIN_TOKEN"):
        Settings()


def test_dev_mode_allows_an_empty_token():
    assert Settings(dev=True).admin_token == ""


def test_env_overrides_yaml_which_overrides_defaults(monkeypatch, tmp_path):
    config = tmp_path / "fairlane.yaml"
    config.write_text("model: dummy\nport: 9001\ntiers: [gold, silver]\nmax_num_seqs: 8\n")
    monkeypatch.setenv("FAIRLANE_CONFIG", str(config))
    monkeypatch.setenv("FAIRLANE_ADMIN_TOKEN", STRONG)
    monkeypatch.setenv("FAIRLANE_PORT", "9002")
    settings = Settings()
    assert (settings.model, settings.port, settings.tiers, settings.max_num_seqs) == ("dummy", 9002, ["gold", "silver"], 8)
    assert settings.block_size == 16  # default


def test_embedded_default_yaml_is_valid(monkeypatch):
    monkeypatch.delenv("FAIRLANE_CONFIG")
    settings = Settings(admin_token=STRONG)
    assert settings.model == "smollm2" and settings.tiers == ["priority", "standard", "batch"]


def test_tiers_must_be_distinct():
    with pytest.raises(ValidationError, match="tiers"):
        Settings(admin_token=STRONG, tiers=["a", "a"])


def test_model_name_defaults_to_the_model_or_folder_name():
    assert Settings(dev=True, model="/models/My-Model").model_name == "My-Model"
    assert Settings(dev=True, model="dummy", served_model_name="tiny").model_name == "tiny"


def test_slo_settings_from_yaml_and_env(monkeypatch, tmp_path):
    config = tmp_path / "fairlane.yaml"
    config.write_text("policy: priority+vtc+slo\ntier_ttft_targets: {priority: 0.5, standard: 2}\n")
    monkeypatch.setenv("FAIRLANE_CONFIG", str(config))
    monkeypatch.setenv("FAIRLANE_TIER_TPOT_TARGETS", '{"priority": 0.05}')
    settings = Settings(admin_token=STRONG)
    assert settings.policy == "priority+vtc+slo" and settings.tier_ttft_targets == {"priority": 0.5, "standard": 2.0}
    assert settings.slo_targets("priority") == (0.5, 0.05) and settings.slo_targets("batch") == (None, None)
    assert settings.slo_gate and not settings.slo_demote


@pytest.mark.parametrize("fields, match", [
    ({"policy": "priority+fair"}, "unknown scheduling policy"),
    ({"policy": "priority+slo", "tier_ttft_targets": {"gold": 1.0}}, "unknown tiers"),
    ({"policy": "priority+slo", "tier_tpot_targets": {"batch": 0}}, "positive seconds"),
    ({"policy": "priority", "tier_ttft_targets": {"priority": 1.0}}, r"add '\+slo'"),
])
def test_bad_slo_settings_are_refused(fields, match):
    with pytest.raises(ValidationError, match=match):
        Settings(admin_token=STRONG, **fields)
