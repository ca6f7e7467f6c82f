"""Metrics read by real Prometheus servers (Debian's ``prometheus`` and
``prometheus-pushgateway``, installed by ``make test``): a continuous run scraped
over /metrics, a scheduled run and an operation pushed to the Pushgateway, and the
ledger exporter. Counts are checked against the ledger and against plain Python
over the produced records."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from deltalake import DeltaTable
from prometheus_client.parser import text_string_to_metric_families

from include.dashboard_preview import CHROMIUM, preview
from include.dashboard_preview import panels as dashboard_panels
from jobs.local_server import find_free_port
from jobs.settings import REPO_ROOT
from tests.conftest import (
    continuous_pipeline,
    pipeline_file,
    produce,
    recent_clicks,
    run_jobs,
    start_stream,
)
from tests.expected import parse_click

pytestmark = pytest.mark.skipif(
    not (shutil.which("prometheus") and shutil.which("prometheus-pushgateway"))
    or not CHROMIUM.exists(),
    reason="Debian's prometheus, prometheus-pushgateway and chromium are not installed "
    "(make test does)",
)
ARTIFACTS = REPO_ROOT / "test-artifacts"
BAD = [b"not json", b'{"user_id": "u1"}', b"[1, 2]", None]


def records(n: int, salt: int) -> list[bytes | None]:
    good: list[bytes | None] = list(recent_clicks(n, salt))
    return good + BAD * 3


def http_get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return bytes(reply.read())


def wait_for(what: str, check: Any, seconds: float = 120) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        try:
            found = check()
        except OSError:
            found = None
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def server(args: list[str], port: int, ready_path: str) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    wait_for(args[0], lambda: http_get(f"http://127.0.0.1:{port}{ready_path}"), 60)
    return process


def stop(process: subprocess.Popen[Any]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[int, int, int]]:
    """(Prometheus's port, the stream's and the exporter's ports it scrapes every
    second on loopback)."""
    port, target = find_free_port(16000, 16500), find_free_port(16500, 17000)
    exporter = find_free_port(17000, 17500)
    config = tmp_path / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s"},
                "scrape_configs": [
                    {
                        "job_name": "stream",
                        "static_configs": [{"targets": [f"127.0.0.1:{target}"]}],
                    },
                    {
                        "job_name": "platform-ledger",
                        "static_configs": [{"targets": [f"127.0.0.1:{exporter}"]}],
                    },
                ],
            }
        )
    )
    process = server(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        port,
        "/-/ready",
    )
    try:
        yield port, target, exporter
    finally:
        stop(process)


def query(port: int, promql: str) -> dict[tuple[tuple[str, str], ...], float]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    reply = json.loads(http_get(url))
    assert reply["status"] == "success", reply
    return {
        tuple(sorted(r["metric"].items())): float(r["value"][1]) for r in reply["data"]["result"]
    }


def ledger(warehouse: Path) -> list[dict[str, Any]]:
    rows = DeltaTable(str(warehouse / "user_clicks" / "_ledger")).to_pyarrow_table().to_pylist()
    return [r for r in rows if r["entry_type"] == "batch"]


def expected_outcomes(produced: list[bytes | None]) -> tuple[int, int]:
    valid = sum(parse_click(v) is not None for v in produced)
    return valid, len(produced) - valid


def test_prometheus_scrapes_a_continuous_run_and_its_counters_equal_the_ledger(
    settings, kafka_config, new_topic, tmp_path, prometheus
) -> None:  # type: ignore[no-untyped-def]
    prom_port, metrics_port, exporter_port = prometheus
    started = time.time()
    topic = new_topic(2)
    path = continuous_pipeline(tmp_path, "user_clicks", topic, max_offsets_per_trigger=150)
    produced = records(400, 0)
    produce(kafka_config, topic, produced)
    stream = start_stream(path, settings, {"PLATFORM_METRICS_PORT": str(metrics_port)})
    exporter = subprocess.Popen(
        [sys.executable, "-m", "jobs", "metrics", "--serve", "--port", str(exporter_port)]
        + [
            "--bootstrap-servers",
            settings.bootstrap_servers,
            "--warehouse",
            str(settings.warehouse),
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )

    def agreed() -> tuple[Any, ...] | None:
        """Prometheus's view and the ledger, once they agree on every record and
        batch (a no-data batch may commit between two reads: then ask again)."""
        by_outcome = query(
            prom_port, 'sum by (outcome, reason) (platform_records_total{job="stream"})'
        )
        committed = query(prom_port, "platform_batches_committed_total")
        # The tables appear one by one when the stream starts: ask for the ledger's.
        made = DeltaTable.is_deltatable(str(settings.warehouse / "user_clicks" / "_ledger"))
        batches = ledger(settings.warehouse) if made else []
        if sum(by_outcome.values()) != len(produced) or list(committed.values()) != [len(batches)]:
            return None
        epoch = query(prom_port, "platform_epoch")
        lag = query(prom_port, "sum(platform_consumer_lag_records)")
        latency = query(prom_port, "platform_event_to_commit_seconds_count")
        return by_outcome, batches, epoch, lag, latency

    try:
        by_outcome, batches, epoch, lag, latency = wait_for(
            "Prometheus to agree with the ledger on every record", agreed, 180
        )
        # An operation for the dashboard's operations panel (allowed next to a stream).
        dry = run_jobs(path, settings, "maintain", "--reason", "dashboard", "--dry-run")
        assert dry.returncode == 0, dry.stderr
        # Every panel of the Grafana dashboard, its queries run against this
        # Prometheus, shows data (a rate needs a few scrapes after the last change).
        ARTIFACTS.mkdir(exist_ok=True)

        def every_panel_has_data() -> list[Any] | None:
            panels = dashboard_panels(f"http://127.0.0.1:{prom_port}", started, time.time())
            return panels if all(p.series for p in panels) else None

        found = wait_for("every dashboard panel to have data", every_panel_has_data, 60)
        assert len(found) == 9
        end = time.time()
        preview(f"http://127.0.0.1:{prom_port}", started, end, ARTIFACTS / "grafana-dashboard.png")
    finally:
        stop(exporter)
        stream.send_signal(signal.SIGTERM)
        _out, err = stream.communicate(timeout=120)
    assert stream.returncode == 0, err[-3000:]
    valid, dead = expected_outcomes(produced)
    outcomes = {
        dict(k).get("outcome", "") + "/" + dict(k).get("reason", ""): v
        for k, v in by_outcome.items()
    }
    assert outcomes == {
        "aggregated/": valid,
        "dead_lettered/malformed": 9,
        "dead_lettered/missing_field": 3,
    }
    assert dead == 12
    assert sum(r["records_valid"] for r in batches) == valid
    assert sum(r["dead_lettered"] for r in batches) == dead
    assert list(epoch.values()) == [max(r["epoch"] for r in batches)]
    assert lag == {(): 0.0}
    with_records = sum(1 for r in batches if r["records_in"])
    assert list(latency.values()) == [with_records]


def test_the_pushgateway_gets_a_scheduled_run_and_an_operation_and_the_exporter_reads_the_ledger(
    settings, kafka_config, new_topic, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    port = find_free_port(17500, 18000)
    gateway = server(
        ["prometheus-pushgateway", f"--web.listen-address=127.0.0.1:{port}"], port, "/-/ready"
    )
    try:
        topic = new_topic(2)
        path = pipeline_file(tmp_path, "user_clicks", topic)
        produced = records(300, 1)
        produce(kafka_config, topic, produced)
        env = {"PLATFORM_PUSHGATEWAY_URL": f"http://127.0.0.1:{port}"}
        ran = run_jobs(path, settings, "run", "--quiet", env=env)
        assert ran.returncode == 0, ran.stderr
        maintained = run_jobs(path, settings, "maintain", "--reason", "metrics test", env=env)
        assert maintained.returncode == 0, maintained.stderr
        pushed = parse(http_get(f"http://127.0.0.1:{port}/metrics").decode())
    finally:
        stop(gateway)
    valid, dead = expected_outcomes(produced)
    run = {"job": "platform", "kind": "run", "application": "user_clicks"}
    assert total(pushed, "platform_records_total", run) == len(produced)
    assert total(pushed, "platform_records_total", {**run, "outcome": "aggregated"}) == valid
    batches = ledger(settings.warehouse)
    assert total(pushed, "platform_batches_committed_total", run) == len(batches)
    operation = {"kind": "maintain", "operation": "maintain", "result": "applied"}
    assert total(pushed, "platform_operations_total", operation) == 1

    exported = run_exporter(settings)
    assert total(exported, "platform_ledger_records_total", {"outcome": "valid"}) == valid
    assert total(exported, "platform_ledger_records_total", {"outcome": "dead_lettered"}) == dead
    assert total(exported, "platform_ledger_batches_total", {}) == len(batches)
    assert total(exported, "platform_ledger_consumer_lag_records", {}) == 0
    assert total(exported, "platform_exporter_broker_up", {}) == 1
    assert total(exported, "platform_ledger_operations_total", {"operation": "maintain"}) >= 1


Samples = list[tuple[str, dict[str, str], float]]


def parse(text: str) -> Samples:
    return [
        (s.name, s.labels, s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def total(samples: Samples, name: str, labels: dict[str, str]) -> float:
    return sum(
        value
        for sample, found, value in samples
        if sample == name and all(found.get(k) == v for k, v in labels.items())
    )


def run_exporter(settings: Any) -> Samples:
    done = subprocess.run(
        [sys.executable, "-m", "jobs", "metrics"]
        + ["--bootstrap-servers", settings.bootstrap_servers]
        + ["--warehouse", str(settings.warehouse)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return parse(done.stdout)
