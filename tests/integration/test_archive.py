"""The raw archive: a backfill reaches records that Kafka's retention deleted."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition
from deltalake import DeltaTable

from jobs import kafka_admin
from jobs.pipeline.parser import load_pipeline
from jobs.streaming.run import run_pipeline
from tests.conftest import pipeline_file, produce, run_jobs
from tests.expected import clicks_per_window, state_as_counter

pytestmark = pytest.mark.integration


def test_backfill_from_the_archive_after_retention(
    spark, settings, kafka_config, new_topic, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(1)
    path = pipeline_file(tmp_path, "user_clicks", topic, archive=True, max_offsets_per_trigger=400)
    now = int(time.time())
    values = [
        json.dumps({"user_id": f"u{i % 9}", "timestamp": now - 200 + i % 150}).encode()
        for i in range(1000)
    ] + [b"not json"]
    produce(kafka_config, topic, values)
    run_pipeline(spark, load_pipeline(str(path), tmp_path), settings)

    raw_path = Path(settings.warehouse / "user_clicks" / "raw")
    raw_table = DeltaTable(str(raw_path))
    raw = raw_table.to_pyarrow_table()
    assert sorted(raw["offset"].to_pylist()) == list(range(len(values)))  # once each
    # The source tasks wrote one file per batch's range; the batches committed them
    # all (an unfailed run leaves no orphan), each under its batch.
    batches = sorted(set(raw["batch_id"].to_pylist()))
    assert len(batches) == 3  # 1001 records, 400 per trigger
    on_disk = {f.name for f in raw_path.glob("part-*.parquet")}
    assert on_disk == {Path(uri).name for uri in raw_table.file_uris()}
    assert len(on_disk) == len(batches)
    assert not list((raw_path / "_staging").iterdir())

    admin = kafka_admin.admin(kafka_config)
    for future in admin.delete_records([TopicPartition(topic, 0, 600)]).values():
        future.result()

    def backfill(*extra: str) -> subprocess.CompletedProcess[str]:
        reason = ["--reason", "recompute after retention"]
        return run_jobs(path, settings, "backfill", "--from-earliest", *reason, *extra, spark=spark)

    from_kafka = backfill()
    assert from_kafka.returncode == 2
    assert (
        "no longer on the broker" in from_kafka.stderr and "--source archive" in from_kafka.stderr
    )
    from_archive = backfill("--source", "archive")
    assert from_archive.returncode == 0, from_archive.stderr
    expected, _dead, _late = clicks_per_window([values])
    state = DeltaTable(str(settings.warehouse / "user_clicks" / "state")).to_pyarrow_table()
    assert state_as_counter(state.to_pylist(), "clicks") == expected

    # A start the stream has not read up to yet (records produced since its last
    # batch) is a start like any other: the backfill starts from the boundary at or
    # before it, whatever the source (found by the random sequences: the archive's
    # backfill took the stream's position for the log end and refused).
    produce(kafka_config, topic, values[:20])
    ahead = json.dumps({topic: {"0": len(values) + 10}})
    reason = ["--reason", "from a later start"]
    later = run_jobs(
        path,
        settings,
        "backfill",
        "--from-offset",
        ahead,
        "--source",
        "archive",
        *reason,
        spark=spark,
    )
    assert later.returncode == 0, later.stderr
    state = DeltaTable(str(settings.warehouse / "user_clicks" / "state")).to_pyarrow_table()
    assert state_as_counter(state.to_pylist(), "clicks") == expected
