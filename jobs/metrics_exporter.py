"""``python -m jobs metrics [--serve]``: every application of the warehouse as
Prometheus sees it from outside, from its ledger and the broker, so an application
is watched while nothing runs (a scheduled app between runs, a stopped stream).

Computed at scrape time. The ledger is read incrementally: only data files not
seen at the previous scrape (the ledger only appends; a compaction by ``maintain``
replaces files, and then the totals are recomputed from scratch). The names
differ from a run's own counters (``platform_ledger_*``) so that summing a job's
series and the exporter's never counts a record twice.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter as Tally
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow.parquet as pq
from deltalake import DeltaTable
from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from jobs import kafka_admin
from jobs.delta import layout as tables
from jobs.errors import ConfigError, PlatformError
from jobs.pipeline.model import APPLICATION_ID
from jobs.pipeline.parser import load_pipeline
from jobs.settings import Settings
from jobs.warehouse import Location

log = logging.getLogger(__name__)

COLUMNS = [
    "entry_type",
    "epoch",
    "records_in",
    "records_valid",
    "filtered",
    "dead_lettered",
    "pipeline_version",
    "end_offsets",
    "details",
    "commit_time",
]


@dataclass
class LedgerTotals:
    """What one application's ledger adds up to, from the files read so far."""

    files: set[str] = field(default_factory=set)
    records: Tally[tuple[str, str]] = field(default_factory=Tally)  # (version, outcome)
    batches: Tally[str] = field(default_factory=Tally)  # version
    operations: Tally[tuple[str, str]] = field(default_factory=Tally)  # (kind, phase)
    epoch: int = 0
    last_commit_us: int | None = None
    last_version: str = ""
    last_end_offsets: dict[str, dict[str, int]] = field(default_factory=dict)

    def add(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            version = str(row["pipeline_version"])
            self.epoch = max(self.epoch, int(row["epoch"]))
            if row["entry_type"] != "batch":
                phase = json.loads(row["details"] or "{}").get("phase", "")
                self.operations[(row["entry_type"], str(phase))] += 1
                continue
            self.batches[version] += 1
            self.records[(version, "valid")] += int(row["records_valid"] or 0)
            if row.get("filtered"):
                self.records[(version, "filtered")] += int(row["filtered"])
            self.records[(version, "dead_lettered")] += int(row["dead_lettered"] or 0)
            commit_us = int(row["commit_time"].timestamp() * 1_000_000)
            if self.last_commit_us is None or commit_us >= self.last_commit_us:
                self.last_commit_us = commit_us
                self.last_version = version
                self.last_end_offsets = json.loads(row["end_offsets"] or "{}")


class LedgerCollector(Collector):
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.totals: dict[str, LedgerTotals] = {}
        # Scrapes run on the HTTP server's threads: two at once must not both add
        # the same new files.
        self._lock = threading.Lock()

    def applications(self) -> list[tuple[str, Location]]:
        root = self.settings.warehouse
        if not root.is_dir():
            return []
        return [
            (path.name, path / tables.LEDGER)
            for path in sorted(root.iterdir())
            if APPLICATION_ID.fullmatch(path.name)
            and DeltaTable.is_deltatable(str(path / tables.LEDGER))
        ]

    def read(self, application: str, ledger: Location) -> LedgerTotals:
        files = set(DeltaTable(str(ledger)).file_uris())
        totals = self.totals.get(application)
        if totals is None or not totals.files <= files:
            totals = LedgerTotals()  # new, or compacted since: from scratch
        for uri in sorted(files - totals.files):
            with tables.file_location(uri).open_reader() as handle:
                present = set(pq.read_schema(handle).names)  # older files lack newer columns
                totals.add(
                    pq.read_table(handle, columns=[c for c in COLUMNS if c in present]).to_pylist()
                )
            totals.files.add(uri)
        self.totals[application] = totals
        return totals

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            families = self._families()
        yield from families

    def _families(self) -> list[Metric]:
        app = ["application"]
        records = CounterMetricFamily(
            "platform_ledger_records",
            "Records of committed batches per the ledger: valid (aggregated), filtered or "
            "dead_lettered",
            labels=[*app, "pipeline_version", "outcome"],
        )
        batches = CounterMetricFamily(
            "platform_ledger_batches",
            "Batches committed per the ledger",
            labels=[*app, "pipeline_version"],
        )
        operations = CounterMetricFamily(
            "platform_ledger_operations",
            "Operations per the ledger, by kind and phase (started, done, dry_run, ...)",
            labels=[*app, "operation", "phase"],
        )
        epoch = GaugeMetricFamily("platform_ledger_epoch", "The application's epoch", labels=app)
        last = GaugeMetricFamily(
            "platform_ledger_last_commit_timestamp_seconds",
            "Unix time of the last committed batch",
            labels=[*app, "pipeline_version"],
        )
        age = GaugeMetricFamily(
            "platform_ledger_last_commit_age_seconds",
            "Seconds since the last committed batch",
            labels=app,
        )
        lag = GaugeMetricFamily(
            "platform_ledger_consumer_lag_records",
            "Records in the topic-partition after the last committed batch's end offset",
            labels=[*app, "topic", "partition"],
        )
        interval = GaugeMetricFamily(
            "platform_pipeline_trigger_interval_seconds",
            "The pipeline's trigger interval (alerts compare the last commit's age to it)",
            labels=[*app, "mode"],
        )
        for application, (mode, seconds) in sorted(self.triggers().items()):
            interval.add_metric([application, mode], seconds)
        broker_up = GaugeMetricFamily(
            "platform_exporter_broker_up", "1 when the broker answered this scrape", labels=[]
        )
        config = kafka_admin.client_config(
            self.settings.bootstrap_servers, self.settings.kafka_client
        )
        reachable = 1
        now = time.time()
        for application, ledger in self.applications():
            try:
                totals = self.read(application, ledger)
            except Exception as exc:  # one unreadable ledger must not hide the others
                log.warning("ledger of %s not read: %s", application, exc)
                continue
            for (version, outcome), count in sorted(totals.records.items()):
                records.add_metric([application, version, outcome], count)
            for version, count in sorted(totals.batches.items()):
                batches.add_metric([application, version], count)
            for (kind, phase), count in sorted(totals.operations.items()):
                operations.add_metric([application, kind, phase], count)
            epoch.add_metric([application], totals.epoch)
            if totals.last_commit_us is None:
                continue
            last.add_metric([application, totals.last_version], totals.last_commit_us / 1e6)
            age.add_metric([application], max(0.0, now - totals.last_commit_us / 1e6))
            if not reachable or not totals.last_end_offsets:
                continue
            try:
                lags = kafka_admin.consumer_lag(config, totals.last_end_offsets)
            except Exception as exc:  # one unreachable broker must not fail the scrape
                log.warning("consumer lag not known: %s", exc)
                reachable = 0
                continue
            for (topic, partition), behind in sorted(lags.items()):
                lag.add_metric([application, topic, str(partition)], behind)
        broker_up.add_metric([], reachable)
        return [records, batches, operations, epoch, last, age, lag, interval, broker_up]

    def triggers(self) -> dict[str, tuple[str, float]]:
        """application -> (trigger mode, interval seconds) of the pipeline files."""
        found: dict[str, tuple[str, float]] = {}
        for path in sorted(self.settings.pipelines_dir.glob("*.y*ml")):
            try:
                pipeline = load_pipeline(str(path), self.settings.pipelines_dir)
            except PlatformError as exc:  # one broken file must not hide the others
                log.warning("pipeline %s not read: %s", path.name, exc)
                continue
            found[pipeline.application_id] = (
                pipeline.trigger_mode,
                float(pipeline.trigger_interval_seconds),
            )
        return found


def registry(settings: Settings) -> CollectorRegistry:
    found = CollectorRegistry()
    found.register(LedgerCollector(settings))
    return found


def exposition(settings: Settings) -> str:
    """The metrics once, in Prometheus's text format."""
    return generate_latest(registry(settings)).decode()


def serve_forever(settings: Settings, port: int, address: str) -> int:
    try:
        start_http_server(port, addr=address, registry=registry(settings))
    except OSError as exc:
        raise ConfigError(
            f"cannot serve metrics on {address}:{port} ({exc.strerror}); choose a free --port"
        ) from exc
    print(
        f"metrics of every application in {settings.warehouse} on http://{address}:{port}/metrics"
    )
    while True:
        time.sleep(3600)
