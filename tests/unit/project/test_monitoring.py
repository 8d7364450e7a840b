"""The alert rules and the Grafana dashboard shipped in monitoring/ load, and name only
metrics `cdc metrics` serves (promtool checks the rules too where it is installed)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import yaml

from cdc.check.status import PipelineStatus
from cdc.cli.metrics import families
from cdc.stack.components.base import ComponentStatus

MONITORING = Path(__file__).resolve().parents[3] / "monitoring"
RULES = MONITORING / "prometheus" / "cdc-alerts.yml"
DASHBOARD = MONITORING / "grafana" / "cdc-dashboard.json"
_METRIC = re.compile(r"\bcdc_[a-z0-9_]+")
_DURATION = re.compile(r"^\d+[smhd]$")


def served() -> set[str]:
    """Every series name the exporter serves, with the suffixes of its metric types."""
    pipeline = PipelineStatus("cdc", "done", "0/1", None, None)
    names = set()
    for family in families([ComponentStatus("kafka", True, "127.0.0.1:9092", True)], pipeline):
        suffixes = {
            "counter": ["_total"],
            "histogram": ["_bucket", "_sum", "_count"],
        }.get(family.type, [""])
        names |= {family.name + s for s in suffixes}
    return names


def test_the_alert_rules_load_and_name_served_metrics() -> None:
    document = yaml.safe_load(RULES.read_text())
    rules = [rule for group in document["groups"] for rule in group["rules"]]
    assert len(rules) >= 8
    names = served()
    assert "cdc_store_freshness_seconds_bucket" in names  # the exporter was read
    for rule in rules:
        assert re.fullmatch(r"Cdc[A-Za-z0-9]+", rule["alert"]), rule
        assert rule["labels"]["severity"] in ("page", "ticket"), rule
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule
        assert "for" not in rule or _DURATION.match(rule["for"]), rule
        expr = rule["expr"]
        assert expr.count("(") == expr.count(")"), rule
        used = set(_METRIC.findall(expr))
        assert used and used <= names, (rule["alert"], used - names)
    alerts = {rule["alert"] for rule in rules}
    assert "CdcStoreFreshnessSloBreached" in alerts
    if shutil.which("promtool"):
        checked = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True)
        assert checked.returncode == 0, checked.stderr


def test_the_dashboard_loads_and_names_served_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    names = served()
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    assert len(exprs) >= 10
    for expr in exprs:
        used = set(_METRIC.findall(expr))
        assert used and used <= names, (expr, used - names)
        assert expr.count("(") == expr.count(")"), expr
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "pipeline"} <= variables
    assert any("cdc_store_freshness_seconds_bucket" in e for e in exprs)
