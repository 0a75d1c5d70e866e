"""configs/prometheus/alerts.yml and the Grafana dashboard: the rules file parses as Prometheus rule
groups, every expression parses as PromQL (promql-parser, the Rust parser of GreptimeDB), every
metric they read is one fairlane exports, and where promtool is installed (Debian: apt-get install
prometheus) `promtool check rules` accepts the file and `promtool test rules` passes its unit tests."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import promql_parser
import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from gateway.telemetry import metrics

REPO = Path(__file__).resolve().parents[2]
ALERTS = REPO / "configs" / "prometheus" / "alerts.yml"
DASHBOARD = REPO / "configs" / "grafana" / "fairlane-dashboard.json"
# Read at scrape time by the gateway's /metrics (gateway/api/routes/metrics.py).
SCRAPE_TIME = {
    "fairlane_lane_depth",
    "fairlane_lane_pending",
    "fairlane_quota_store_up",
    "fairlane_tier_ttft_target_seconds",
}
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def exported() -> set[str]:
    names = set(SCRAPE_TIME)
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase):
            names |= {value._name + suffix for suffix in SUFFIXES[value._type]}
    return names


def rules() -> list[dict]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def dashboard_exprs() -> list[str]:
    return [t["expr"] for panel in json.loads(DASHBOARD.read_text())["panels"] for t in panel["targets"]]


def test_rule_groups_are_well_formed():
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    assert len({g["name"] for g in groups}) == len(groups)
    alerts = {r["alert"] for r in rules() if "alert" in r}
    assert alerts == {
        "FairlanePreemptionRateHigh",
        "FairlaneTTFTP99OverTarget",
        "FairlaneKVCachePinned",
        "FairlaneLaneDepthGrowing",
        "FairlaneQuotaStoreDown",
    }
    for rule in rules():
        assert ("alert" in rule) != ("record" in rule) and rule["expr"].strip()
        if "alert" in rule:
            assert rule["labels"]["severity"] in ("page", "warning") and rule["annotations"]["summary"]
            assert rule["annotations"]["runbook"].startswith("docs/observability.md#")
    preemption = next(r for r in rules() if r.get("alert") == "FairlanePreemptionRateHigh")
    assert (
        preemption["for"] == "5m" and "> 0.02" in preemption["expr"]
    )  # the usual guidance: 2% for 5 minutes


@pytest.mark.parametrize("source", ["alerts", "dashboard"])
def test_every_expression_parses_and_reads_exported_metrics(source):
    exprs = [r["expr"] for r in rules()] if source == "alerts" else dashboard_exprs()
    recorded = {r["record"] for r in rules() if "record" in r}
    known = exported() | recorded
    assert exprs
    for expr in exprs:
        promql_parser.parse(expr)  # raises ValueError on a syntax error
        for name in re.findall(r"\bfairlane[a-z0-9_:]*", expr):
            assert name in known, f"{name} in {expr!r} is not a metric fairlane exports"


def test_the_parser_refuses_what_promtool_would():
    with pytest.raises(ValueError):
        promql_parser.parse("sum by (tier) (rate(fairlane_requests_total[5m])")


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool is not installed (apt-get install prometheus)"
)
def test_promtool_checks_and_unit_tests_the_rules():
    check = subprocess.run(
        ["promtool", "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0 and "SUCCESS: 8 rules found" in check.stdout, check.stdout + check.stderr
    unit = subprocess.run(
        ["promtool", "test", "rules", "alerts_test.yml"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ALERTS.parent,
    )
    assert unit.returncode == 0 and "SUCCESS" in unit.stdout, unit.stdout + unit.stderr
