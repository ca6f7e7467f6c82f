"""The platform's Prometheus metrics (prometheus-client), in one registry per process.

How they leave the process:
- a continuous run serves ``/metrics`` on ``PLATFORM_METRICS_PORT`` (``serve``);
- a scheduled (available-now) run and an operation push to the Pushgateway at
  ``PLATFORM_PUSHGATEWAY_URL`` when they end, Prometheus's convention for batch jobs
  (``push``);
- ``python -m jobs metrics --serve`` reports every application from its ledger and
  the broker, so Prometheus sees an application while nothing runs
  (``jobs/metrics_exporter.py``).

Labels are the application and pipeline version, plus small fixed sets (outcome,
dead-letter reason class, operation, result, topic-partition): never a key or a
user id, so the number of series stays bounded.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    push_to_gateway,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

LABELS = ("application", "pipeline_version")
PUSH_JOB = "platform"
# Seconds: a batch takes from well under a second (small, warm) to minutes (backlog).
DURATION_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 900)
LATENCY_BUCKETS = (0.5, 1, 2, 3, 5, 10, 30, 60, 300, 900, 3600, 21600, 86400)


def reason_class(reason: str) -> str:
    """A dead letter's reason (``jobs/streaming/query.py`` writes them) as one of a
    few classes: the reason itself holds values and field names (unbounded)."""
    if reason.startswith("late:"):
        return "late"
    if reason.startswith("event time "):
        return "event_time"
    if reason.startswith("missing or null field"):
        return "missing_field"
    if reason.startswith("field ") and " is not a " in reason:
        return "wrong_type"
    if reason.startswith("field ") or reason.endswith("overflows"):
        return "bad_value"
    if reason.startswith(("value is", "not a JSON", "invalid record")):
        return "malformed"
    if reason.startswith(("derived ", "filter ")):
        return "expression"
    return "other"


class Metrics:
    """Every metric the jobs record; the exporter's are computed at scrape time."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.records = Counter(
            "platform_records",
            "Records read from Kafka by committed batches, by outcome: aggregated, filtered, "
            "late (a dead letter behind the watermark), dead_lettered (by reason class)",
            [*LABELS, "outcome", "reason"],
            registry=r,
        )
        self.batches = Counter(
            "platform_batches_committed", "Batches committed to Delta", LABELS, registry=r
        )
        self.replays_skipped = Counter(
            "platform_batches_replay_skipped",
            "Replayed batches found already committed and skipped",
            LABELS,
            registry=r,
        )
        self.fenced = Counter(
            "platform_commits_fenced",
            "Runs stopped because a newer epoch fenced their commits",
            LABELS,
            registry=r,
        )
        self.batch_duration = Histogram(
            "platform_batch_duration_seconds",
            "Seconds from a batch's start in foreachBatch to its ledger commit",
            LABELS,
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.event_to_commit = Histogram(
            "platform_event_to_commit_seconds",
            "Per batch: seconds from its oldest record's Kafka timestamp to its commit",
            LABELS,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        # Asked of the broker when scraped or pushed, not after every batch.
        self._lock = threading.Lock()
        self.lag_sources: dict[tuple[str, str], LagSource] = {}
        r.register(_LagCollector(self))
        self.last_commit = Gauge(
            "platform_last_commit_timestamp_seconds",
            "Unix time of the last committed batch",
            LABELS,
            registry=r,
        )
        self.epoch = Gauge("platform_epoch", "The application's epoch", LABELS, registry=r)
        self.operations = Counter(
            "platform_operations",
            "Operations (rewind, rebuild, backfill, maintain, ...) by kind and result",
            [*LABELS, "operation", "result"],
            registry=r,
        )

    def batch_committed(
        self,
        application: str,
        version: int,
        ledger_row: Mapping[str, Any],
        reasons: Iterable[str],
        oldest_record_us: int | None,
        seconds: float,
    ) -> None:
        """Counts a committed batch. Never raises: a metric must not fail a batch
        that is committed already (a failure is logged and the batch goes uncounted)."""
        try:
            self._batch_committed(
                (application, str(version)), ledger_row, reasons, oldest_record_us, seconds
            )
        except Exception:
            log.exception("metrics of a committed batch of %s not recorded", application)

    def _batch_committed(
        self,
        labels: tuple[str, str],
        ledger_row: Mapping[str, Any],
        reasons: Iterable[str],
        oldest_record_us: int | None,
        seconds: float,
    ) -> None:
        self.records.labels(*labels, "aggregated", "").inc(int(ledger_row["records_valid"]))
        filtered = int(ledger_row.get("filtered") or 0)
        if filtered:  # a series appears once a record is filtered, as dead letters' do
            self.records.labels(*labels, "filtered", "").inc(filtered)
        for kind, count in Tally(reason_class(r) for r in reasons).items():
            if kind == "late":
                self.records.labels(*labels, "late", "").inc(count)
            else:
                self.records.labels(*labels, "dead_lettered", kind).inc(count)
        self.batches.labels(*labels).inc()
        self.batch_duration.labels(*labels).observe(seconds)
        committed_s = ledger_row["commit_time"].timestamp()
        if oldest_record_us is not None:
            self.event_to_commit.labels(*labels).observe(
                max(0.0, committed_s - oldest_record_us / 1e6)
            )
        self.last_commit.labels(*labels).set(committed_s)
        self.epoch.labels(*labels).set(int(ledger_row["epoch"]))

    def replay_skipped(self, application: str, version: int) -> None:
        self.replays_skipped.labels(application, str(version)).inc()

    def fenced_commit(self, application: str, version: int) -> None:
        self.fenced.labels(application, str(version)).inc()

    def operation(self, application: str, version: int, kind: str, result: str) -> None:
        self.operations.labels(application, str(version), kind, result).inc()

    def watch_lag(self, application: str, version: int, source: LagSource) -> None:
        """``source()``: records per (topic, partition) after the last commit; asked
        while the run is watched (a warm driver's runs come and go)."""
        with self._lock:
            self.lag_sources[(application, str(version))] = source

    def unwatch_lag(self, application: str) -> None:
        with self._lock:
            for key in [k for k in self.lag_sources if k[0] == application]:
                del self.lag_sources[key]


LagSource = Callable[[], Mapping[tuple[str, int], int]]
LAG = "platform_consumer_lag_records"
LAG_HELP = "Records in the topic-partition after the last committed batch's end offset"


class _LagCollector(Collector):
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def describe(self) -> list[Metric]:
        return [GaugeMetricFamily(LAG, LAG_HELP, labels=[*LABELS, "topic", "partition"])]

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(LAG, LAG_HELP, labels=[*LABELS, "topic", "partition"])
        with self.metrics._lock:
            sources = list(self.metrics.lag_sources.items())
        for (application, version), source in sources:
            try:
                lags = source()
            except Exception as exc:  # a scrape must not fail for one broker hiccup
                log.warning("consumer lag of %s not known: %s", application, exc)
                continue
            for (topic, partition), lag in sorted(lags.items()):
                family.add_metric([application, version, topic, str(partition)], lag)
        yield family


# This process's metrics: jobs record into it, ``serve`` and ``push`` send it out.
METRICS = Metrics()


def serve(port: int, address: str) -> None:
    """``/metrics`` of this process, from a daemon thread, until it exits. A port
    that is taken costs the endpoint, never the run (it is logged as a warning)."""
    try:
        start_http_server(port, addr=address, registry=METRICS.registry)
    except OSError as exc:
        log.warning(
            "metrics NOT served: %s:%d is taken (%s); give this run its own PLATFORM_METRICS_PORT",
            address,
            port,
            exc.strerror,
        )
        return
    log.info("metrics on http://%s:%d/metrics", address, port)


def push(gateway_url: str, application: str, kind: str) -> None:
    """This process's series of ``application`` to the Pushgateway, grouped by
    application and kind of job (``run`` or an operation's name); a push replaces
    that group's last one. A gateway that is down costs the push, never the run or
    operation: its result is committed already."""
    view = _Collected(list(_ApplicationView(METRICS.registry, application).collect()))
    if not view.families:
        return  # nothing recorded: keep the group's last push rather than empty it
    try:
        push_to_gateway(
            gateway_url,
            job=PUSH_JOB,
            grouping_key={"application": application, "kind": kind},
            registry=view,
            timeout=10,
        )
    except Exception as exc:  # whatever the gateway does, the result stands
        log.warning("metrics not pushed to %s: %s", gateway_url, exc)


class _ApplicationView(Collector):
    """One application's series of a registry (a warm driver's holds several)."""

    def __init__(self, registry: CollectorRegistry, application: str) -> None:
        self.registry = registry
        self.application = application

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            samples = [s for s in family.samples if s.labels.get("application") == self.application]
            if samples:
                view = Metric(family.name, family.documentation, family.type, family.unit)
                view.samples = samples
                yield view


class _Collected(Collector):
    """Families collected once (the lag in them asked of the broker once)."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families
