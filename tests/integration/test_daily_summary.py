"""The downstream example: ``summarize`` keeps ``<app>_daily`` equal to a plain
Python summary of the same clicks, incrementally, and Delta's own marker makes a
repeated MERGE of a state version a no-op."""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from jobs.pipeline.parser import load_pipeline
from jobs.streaming.run import run_pipeline
from tests.conftest import pipeline_file, produce, run_jobs
from tests.expected import clicks_per_window

pytestmark = pytest.mark.integration
DAY_S = 86_400


def expected_days(counts: Counter[tuple[str, int]]) -> dict[date, tuple[int, int, int]]:
    """(state rows, distinct users, clicks) per UTC day of the window start."""
    rows: dict[date, list[tuple[str, int]]] = defaultdict(list)
    for (user, start), clicks in counts.items():
        rows[datetime.fromtimestamp(start, UTC).date()].append((user, clicks))
    return {
        day: (len(found), len({u for u, _ in found}), sum(c for _, c in found))
        for day, found in rows.items()
    }


def summary(path: Path) -> dict[date, tuple[int, int, int]]:
    rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    return {r["day"]: (r["state_rows"], r["distinct_keys"], r["clicks_total"]) for r in rows}


def clicks(n: int, salt: int, spread_s: int) -> list[bytes]:
    now = int(time.time())
    return [
        json.dumps(
            {"user_id": f"u{(i * 7 + salt) % 13}", "timestamp": now - (i * 433) % spread_s}
        ).encode()
        for i in range(n)
    ]


def test_the_daily_summary_follows_the_state_exactly_once(
    spark, settings, kafka_config, new_topic, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(2)
    path = pipeline_file(tmp_path, "user_clicks", topic)
    pipeline = load_pipeline(str(path), tmp_path)
    daily = Path(settings.warehouse) / "user_clicks_daily"

    refused = run_jobs(path, settings, "summarize", spark=spark)
    assert refused.returncode == 2
    assert "run the pipeline first" in refused.stderr.splitlines()[-1]

    # Three days of clicks in the first batch (no watermark yet), then today's.
    first = clicks(600, 0, 3 * DAY_S)
    produce(kafka_config, topic, first)
    run_pipeline(spark, pipeline, settings)
    done = run_jobs(path, settings, "summarize", spark=spark)
    assert done.returncode == 0, done.stderr
    assert "every day" in done.stdout
    assert summary(daily) == expected_days(clicks_per_window([first])[0])
    assert len(summary(daily)) >= 3

    again = run_jobs(path, settings, "summarize", spark=spark)
    assert again.returncode == 0 and "up to date" in again.stdout
    version = DeltaTable(str(daily)).version()

    second = clicks(300, 5, 200)  # the last few minutes: today only
    produce(kafka_config, topic, second)
    run_pipeline(spark, pipeline, settings)
    more = run_jobs(path, settings, "summarize", spark=spark)
    assert more.returncode == 0, more.stderr
    assert "1 day(s) recomputed" in more.stdout or "2 day(s) recomputed" in more.stdout
    assert summary(daily) == expected_days(clicks_per_window([first, second])[0])
    assert DeltaTable(str(daily)).version() == version + 1

    # A MERGE repeated with the same marker (a run retried after its commit) is
    # skipped by Delta itself, whatever it would write.
    state_version = DeltaTable(str(settings.warehouse / "user_clicks" / "state")).version()
    assert DeltaTable(str(daily)).transaction_version("user_clicks/daily_summary") == state_version
    before = summary(daily)
    from delta.tables import DeltaTable as SparkDeltaTable

    wrong: Any = spark.createDataFrame(
        [(d, 999, 999, 999, state_version) for d in before],
        "day date, state_rows long, distinct_keys long, clicks_total long, state_version long",
    )
    spark.conf.set("spark.databricks.delta.write.txnAppId", "user_clicks/daily_summary")
    spark.conf.set("spark.databricks.delta.write.txnVersion", str(state_version))
    try:
        (
            SparkDeltaTable.forPath(spark, str(daily))
            .alias("t")
            .merge(wrong.alias("s"), "t.day = s.day")
            .whenMatchedUpdateAll()
            .execute()
        )
    finally:
        spark.conf.unset("spark.databricks.delta.write.txnAppId")
        spark.conf.unset("spark.databricks.delta.write.txnVersion")
    assert summary(daily) == before
    assert DeltaTable(str(daily)).version() == version + 1
