"""The monitoring files of the compose stack (include/monitoring): Prometheus's
config and alert rules checked and unit-tested by promtool, and every metric the
dashboard and the alerts name is one the platform exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from jobs.metrics import Metrics
from jobs.metrics_exporter import LedgerCollector
from jobs.settings import REPO_ROOT, load_settings

MONITORING = REPO_ROOT / "include" / "monitoring"
COMPOSE: dict[str, Any] = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())
promtool = pytest.mark.skipif(
    shutil.which("promtool") is None, reason="Debian's prometheus (promtool) is not installed"
)
SUFFIXES = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "gauge": [""]}


def exported_names(tmp_path: Path) -> set[str]:
    """Every series name a run or the exporter can produce."""
    registry = Metrics(CollectorRegistry()).registry
    families = list(registry.collect())
    settings = load_settings()
    families += list(LedgerCollector(settings).collect())
    return {f.name + suffix for f in families for suffix in SUFFIXES[f.type]}


def names_in(text: str) -> set[str]:
    return set(re.findall(r"\bplatform_\w+", text))


def test_the_dashboard_and_the_alerts_name_only_exported_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PLATFORM_WAREHOUSE", str(tmp_path))  # no application: no broker call
    exported = exported_names(tmp_path)
    dashboard = json.loads((MONITORING / "grafana" / "dashboards" / "platform.json").read_text())
    expressions = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert expressions
    used = names_in("\n".join(expressions)) | names_in((MONITORING / "alerts.yml").read_text())
    assert used - exported == set()
    assert {"platform_records_total", "platform_ledger_consumer_lag_records"} <= used


@promtool
def test_the_prometheus_config_and_rules_are_valid(tmp_path: Path) -> None:
    # The config names the rules file where the compose stack mounts it.
    config = (MONITORING / "prometheus.yml").read_text()
    assert "/etc/prometheus/alerts.yml" in config
    (tmp_path / "alerts.yml").write_text((MONITORING / "alerts.yml").read_text())
    (tmp_path / "prometheus.yml").write_text(
        config.replace("/etc/prometheus/alerts.yml", str(tmp_path / "alerts.yml"))
    )
    checked = subprocess.run(
        ["promtool", "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


@promtool
def test_each_alert_fires_on_its_case_and_not_on_an_idle_stream() -> None:
    tested = subprocess.run(
        ["promtool", "test", "rules", "alerts_test.yml"],
        cwd=MONITORING,
        capture_output=True,
        text=True,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_prometheus_scrapes_what_the_stack_serves() -> None:
    services = COMPOSE["services"]
    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    targets = {
        job["job_name"]: job["static_configs"][0]["targets"][0] for job in config["scrape_configs"]
    }
    assert targets["platform-exporter"] == "platform-metrics:9464"
    assert "--port 9464" in services["platform-metrics"]["command"]
    stream_host, stream_port = targets["platform-streams"].split(":")
    environment = services[stream_host]["environment"]
    assert environment["PLATFORM_METRICS_PORT"] == stream_port
    assert environment["PLATFORM_METRICS_ADDRESS"] == "0.0.0.0"  # reachable from Prometheus
    assert environment["PLATFORM_PUSHGATEWAY_URL"] == f"http://{targets['pushgateway']}"
    assert targets["pushgateway"].split(":")[0] in services
    mounts = " ".join(services["prometheus"]["volumes"])
    assert "alerts.yml:/etc/prometheus/alerts.yml" in mounts
