"""The metrics' own logic: reason classes, what a committed batch adds, one
application's view for the Pushgateway, and the exporter's incremental ledger."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from jobs.delta import layout as tables
from jobs.metrics import Metrics, _ApplicationView, reason_class
from jobs.metrics_exporter import LedgerCollector
from jobs.settings import load_settings

# Reasons as jobs/streaming/query.py writes them.
REASONS = {
    "late: window ending 2026-01-01T00:01:00Z closed at watermark 2026-01-01T00:05:00Z": "late",
    "event time 'ts' = 99999999999999 seconds is out of range": "event_time",
    "event time 'ts' = 1 seconds is before 2000-01-01T00:00:00Z (event_time.not_before)": (
        "event_time"
    ),
    "missing or null field 'user_id'": "missing_field",
    "field 'amount' is not a long: abc": "wrong_type",
    "field 'amount' = 1e300 is beyond +-2^53, where a sum of such values overflows 64 bits": (
        "bad_value"
    ),
    "field 'amount' is NaN or infinite": "bad_value",
    "'signed_qty' overflows": "bad_value",
    "value is null": "malformed",
    "value is not valid UTF-8": "malformed",
    "not a JSON object": "malformed",
    "invalid record": "malformed",
    "something new": "other",
}


@pytest.mark.parametrize(("reason", "kind"), REASONS.items())
def test_reason_classes_are_a_small_fixed_set(reason: str, kind: str) -> None:
    assert reason_class(reason) == kind


def samples(registry: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_a_committed_batch_counts_every_record_once() -> None:
    metrics = Metrics(CollectorRegistry())
    committed = datetime(2026, 1, 1, 0, 0, 10, tzinfo=UTC)
    row = {"records_valid": 7, "epoch": 3, "commit_time": committed}
    reasons = ["late: window ending x closed at watermark y", "value is null", "value is null"]
    oldest_us = int(committed.timestamp() * 1e6) - 4_000_000
    metrics.batch_committed("clicks", 2, row, reasons, oldest_us, 1.5)
    got = samples(metrics.registry)
    base = (("application", "clicks"), ("pipeline_version", "2"))

    def records(outcome: str, reason: str) -> float:
        labels = tuple(sorted((*base, ("outcome", outcome), ("reason", reason))))
        return got[("platform_records_total", labels)]

    assert records("aggregated", "") == 7
    assert records("late", "") == 1
    assert records("dead_lettered", "malformed") == 2
    assert got[("platform_batches_committed_total", base)] == 1
    assert got[("platform_epoch", base)] == 3
    assert got[("platform_last_commit_timestamp_seconds", base)] == committed.timestamp()
    assert got[("platform_event_to_commit_seconds_sum", base)] == pytest.approx(4.0)
    assert got[("platform_batch_duration_seconds_count", base)] == 1


def test_a_push_carries_only_its_application() -> None:
    metrics = Metrics(CollectorRegistry())
    metrics.operation("clicks", 1, "rewind", "applied")
    metrics.operation("orders", 1, "rewind", "applied")
    metrics.watch_lag("clicks", 1, lambda: {("t", 0): 5})
    metrics.watch_lag("orders", 1, lambda: {("u", 0): 9})
    view = CollectorRegistry()
    view.register(_ApplicationView(metrics.registry, "clicks"))
    applications = {dict(labels)["application"] for (_name, labels) in samples(view)}
    assert applications == {"clicks"}
    lag = (("application", "clicks"), ("partition", "0"), ("pipeline_version", "1"), ("topic", "t"))
    assert samples(view)[("platform_consumer_lag_records", lag)] == 5


def test_a_failing_lag_source_leaves_the_scrape_working() -> None:
    metrics = Metrics(CollectorRegistry())

    def broken() -> dict[tuple[str, int], int]:
        raise OSError("broker down")

    metrics.watch_lag("clicks", 1, broken)
    metrics.replay_skipped("clicks", 1)
    got = samples(metrics.registry)
    base = (("application", "clicks"), ("pipeline_version", "1"))
    assert got[("platform_batches_replay_skipped_total", base)] == 1
    assert not [k for k in got if k[0] == "platform_consumer_lag_records"]


def ledger_row(entry: str, batch: int | None, valid: int, dead: int, second: int) -> dict[str, Any]:
    return {
        "application_id": "clicks",
        "entry_type": entry,
        "epoch": 1,
        "batch_id": batch,
        "end_offsets": json.dumps({"t": {"0": 10 * second}}),
        "records_in": valid + dead,
        "records_valid": valid,
        "dead_lettered": dead,
        "pipeline_version": 1,
        "processing_guarantee": "exactly_once",
        "details": json.dumps({"phase": "done"}) if entry != "batch" else "{}",
        "commit_time": datetime(2026, 1, 1, 0, 0, second, tzinfo=UTC),
    }


def append(path: Path, *rows: dict[str, Any]) -> None:
    write_deltalake(
        str(path), pa.Table.from_pylist(list(rows), tables.LEDGER_SCHEMA), mode="append"
    )


def test_the_exporter_adds_up_the_ledger_incrementally_and_after_compaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PLATFORM_WAREHOUSE", str(tmp_path))
    monkeypatch.setenv("PLATFORM_BOOTSTRAP_SERVERS", "127.0.0.1:1")  # nothing listens
    ledger = tmp_path / "clicks" / tables.LEDGER
    ledger.parent.mkdir()
    DeltaTable.create(str(ledger), tables.LEDGER_SCHEMA)
    append(ledger, ledger_row("batch", 0, 5, 1, 1), ledger_row("batch", 1, 3, 0, 2))
    collector = LedgerCollector(load_settings())
    totals = collector.read("clicks", ledger)
    assert totals.records == {("1", "valid"): 8, ("1", "dead_lettered"): 1}
    append(ledger, ledger_row("rewind", None, 0, 0, 3), ledger_row("batch", 2, 4, 2, 4))
    totals = collector.read("clicks", ledger)
    assert totals.records == {("1", "valid"): 12, ("1", "dead_lettered"): 3}
    assert totals.batches == {"1": 3}
    assert totals.operations == {("rewind", "done"): 1}
    assert totals.last_end_offsets == {"t": {"0": 40}}
    DeltaTable(str(ledger)).optimize.compact()
    again = collector.read("clicks", ledger)
    assert again is not totals  # files replaced: recomputed
    assert again.records == totals.records and again.batches == totals.batches
