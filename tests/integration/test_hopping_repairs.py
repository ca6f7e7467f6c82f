"""Repairs of a hopping-window pipeline that seed Spark's state from Delta (issue 28):
a rebuild, a rewind that replays from a batch boundary, and backfills, each followed
by more records. Each window's row is seeded into that window only, so the state
equals plain Python over every record: each record in every window
[start, start + size) containing it, with start a multiple of the slide."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml
from deltalake import DeltaTable

from jobs.pipeline.parser import load_pipeline
from jobs.settings import Settings
from jobs.streaming.run import run_pipeline
from jobs.streaming.summary import RunSummary
from tests.conftest import produce, run_jobs
from tests.expected import within_hll_error

pytestmark = pytest.mark.integration
SIZE, SLIDE = 180, 60  # three windows per record
# Version 1 counts every amount twice (the bug a backfill with version 2 fixes).
FACTOR = {1: 2, 2: 1}
Events = list[dict[str, Any]]


def payments_file(tmp_path: Path, topic: str, version: int = 1, **source: Any) -> Path:
    definition = {
        "application_id": "payments",
        "version": version,
        "source": {"topics": [topic], **source},
        "schema": {"user": "string", "cents": "long", "item": "string", "ts": "long"},
        "derived": [{"name": "amount", "expr": f"cents * {FACTOR[version]}"}],
        "keys": ["user"],
        "event_time": {"field": "ts", "unit": "seconds"},
        "window": {"type": "hopping", "size": "3 minutes", "slide": "1 minute"},
        "watermark": "10 minutes",
        "aggregations": [
            {"name": "payments", "function": "count"},
            {"name": "total", "function": "sum", "field": "amount"},
            {"name": "mean", "function": "avg", "field": "amount"},
            {"name": "smallest", "function": "min", "field": "amount"},
            {"name": "largest", "function": "max", "field": "amount"},
            {"name": "items", "function": "approx_count_distinct", "field": "item"},
        ],
        "shuffle_partitions": 2,
    }
    directory = tmp_path / f"v{version}"
    directory.mkdir(exist_ok=True)
    path = directory / "payments.yaml"
    path.write_text(yaml.safe_dump(definition))
    return path


def payments(n: int, salt: int, users: int = 7) -> Events:
    """Payments of the last few minutes (well inside the 10-minute watermark), so
    no record is late; ``salt`` makes another set."""
    now = int(time.time())
    return [
        {
            "user": f"u{(i * 3 + salt) % users}",
            "cents": 1 + (i * 37 + salt) % 500,
            "item": f"i{(i * 13 + salt) % 11}",
            "ts": now - 280 + (i * 17 + salt) % 240,
        }
        for i in range(n)
    ]


def encoded(events: Events) -> list[bytes | None]:
    return [json.dumps(e).encode() for e in events]


def expected(*parts: tuple[Events, int]) -> dict[tuple[str, int], dict[str, Any]]:
    """Per (user, window start): the aggregates of the records (each part's amounts
    as its pipeline version computes them) in that window."""
    cells: dict[tuple[str, int], list[tuple[int, str]]] = defaultdict(list)
    for events, version in parts:
        for e in events:
            amount = e["cents"] * FACTOR[version]
            first = (e["ts"] - SIZE) // SLIDE * SLIDE
            for start in range(first, e["ts"] + 1, SLIDE):
                if start <= e["ts"] < start + SIZE:
                    cells[(e["user"], start)].append((amount, e["item"]))
    return {
        cell: {
            "payments": len(values),
            "total": sum(a for a, _ in values),
            "mean": sum(a for a, _ in values) / len(values),
            "smallest": min(a for a, _ in values),
            "largest": max(a for a, _ in values),
            "items": len({i for _, i in values}),
        }
        for cell, values in cells.items()
    }


def assert_state(settings: Settings, want: dict[tuple[str, int], dict[str, Any]]) -> None:
    rows = DeltaTable(str(settings.warehouse / "payments" / "state")).to_pyarrow_table()
    got = {(r["user"], int(r["window_start"].timestamp())): r for r in rows.to_pylist()}
    assert set(got) == set(want)
    for cell, values in want.items():
        row = got[cell]
        assert row["window_end"].timestamp() - row["window_start"].timestamp() == SIZE
        exact = ("payments", "total", "smallest", "largest")
        assert {k: row[k] for k in exact} == {k: values[k] for k in exact}, cell
        assert row["_records"] == values["payments"], cell
        assert row["mean"] == pytest.approx(values["mean"], rel=1e-12), cell
        assert within_hll_error(row["items"], values["items"]), (cell, row["items"])


def ok(done: Any) -> str:
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return str(done.stdout)


def verified(path: Path, settings: Settings, spark: Any) -> None:
    assert ", 0 differ" in ok(run_jobs(path, settings, "verify", spark=spark))


def run(path: Path, settings: Settings, spark: Any) -> RunSummary:
    return run_pipeline(spark, load_pipeline(str(path), path.parent), settings)


def seeded_rows(summary: RunSummary) -> tuple[int, int]:
    """(rows seeded, rows Spark's state held when checked) of a seeded epoch's run."""
    details = [json.loads(b.ledger["details"]) for b in summary.batches]
    return details[0]["seed_rows"], details[1]["seed_verified_rows"]


def test_a_seeded_rebuild_counts_each_window_once(  # type: ignore[no-untyped-def]
    spark, settings, kafka_config, new_topic, tmp_path
) -> None:
    topic = new_topic(2)
    path = payments_file(tmp_path, topic)
    first = payments(600, 1)
    produce(kafka_config, topic, encoded(first))
    run(path, settings, spark)
    assert_state(settings, expected((first, 1)))

    rebuilt = ok(run_jobs(path, settings, "rebuild", "--reason", "x", spark=spark))
    assert "Spark state is seeded from: Delta state version" in rebuilt
    second = payments(400, 2)
    produce(kafka_config, topic, encoded(second))
    summary = run(path, settings, spark)
    assert summary.epoch == 1
    # Every window is open (recent records): one seed row per window, none per pane.
    windows = len(expected((first, 1)))
    assert seeded_rows(summary) == (windows, windows)
    assert_state(settings, expected((first + second, 1)))
    verified(path, settings, spark)


def test_a_rewind_between_batches_replays_onto_the_seeded_boundary(  # type: ignore[no-untyped-def]
    spark, settings, kafka_config, new_topic, tmp_path
) -> None:
    topic = new_topic(1)
    path = payments_file(tmp_path, topic, max_offsets_per_trigger=100)
    first = payments(400, 3)
    produce(kafka_config, topic, encoded(first))
    run(path, settings, spark)  # batches end at 100, 200, 300, 400
    assert_state(settings, expected((first, 1)))

    target = json.dumps({topic: {"0": 250}})
    ok(run_jobs(path, settings, "rewind", "--to-offset", target, "--reason", "x", spark=spark))
    assert_state(settings, expected((first[:200], 1)))  # back at the boundary at 200
    summary = run(path, settings, spark)
    assert seeded_rows(summary)[0] == seeded_rows(summary)[1] == len(expected((first[:200], 1)))
    assert_state(settings, expected((first, 1)))
    verified(path, settings, spark)

    second = payments(150, 4)
    produce(kafka_config, topic, encoded(second))
    run(path, settings, spark)
    assert_state(settings, expected((first + second, 1)))
    verified(path, settings, spark)


def test_a_backfill_from_earliest_with_a_new_version_is_seeded(  # type: ignore[no-untyped-def]
    spark, settings, kafka_config, new_topic, tmp_path
) -> None:
    topic = new_topic(2)
    v1, v2 = payments_file(tmp_path, topic, 1), payments_file(tmp_path, topic, 2)
    first = payments(500, 5)
    produce(kafka_config, topic, encoded(first))
    run(v1, settings, spark)
    assert_state(settings, expected((first, 1)))

    ok(run_jobs(v2, settings, "backfill", "--from-earliest", "--reason", "x", spark=spark))
    assert_state(settings, expected((first, 2)))
    verified(v2, settings, spark)
    second = payments(300, 6)
    produce(kafka_config, topic, encoded(second))
    summary = run(v2, settings, spark)
    windows = len(expected((first, 2)))
    assert seeded_rows(summary) == (windows, windows)
    assert_state(settings, expected((first + second, 2)))
    verified(v2, settings, spark)


def test_a_backfill_from_a_boundary_builds_on_its_seeded_state(  # type: ignore[no-untyped-def]
    spark, settings, kafka_config, new_topic, tmp_path
) -> None:
    """The boundary's windows go into the batch recomputation as seed rows (each
    into its own window), the records after it are recomputed with version 2."""
    topic = new_topic(1)
    v1 = payments_file(tmp_path, topic, 1, max_offsets_per_trigger=100)
    v2 = payments_file(tmp_path, topic, 2, max_offsets_per_trigger=100)
    first = payments(300, 7)
    produce(kafka_config, topic, encoded(first))
    run(v1, settings, spark)  # batches end at 100, 200, 300

    start = json.dumps({topic: {"0": 200}})
    ok(run_jobs(v2, settings, "backfill", "--from-offset", start, "--reason", "x", spark=spark))
    assert_state(settings, expected((first[:200], 1), (first[200:], 2)))
    second = payments(100, 8)
    produce(kafka_config, topic, encoded(second))
    run(v2, settings, spark)
    assert_state(settings, expected((first[:200], 1), (first[200:] + second, 2)))
