"""The JVM batch clock source (include/jvm/sources): the newest offset log entry's
watermark and batch time, read again each time the one-row table is planned."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from jobs.streaming.batch_clock import TIME_COLUMN, WATERMARK_COLUMN, batch_clock

pytestmark = pytest.mark.integration


def entry(checkpoint: Path, batch_id: int, watermark_ms: int, time_ms: int = 1) -> None:
    offsets = checkpoint / "offsets"
    offsets.mkdir(parents=True, exist_ok=True)
    metadata = {"batchWatermarkMs": watermark_ms, "batchTimestampMs": time_ms, "conf": {}}
    (offsets / str(batch_id)).write_text(f'v1\n{json.dumps(metadata)}\n{{"t":{{"0":1}}}}\n')


def value(table, column: str = WATERMARK_COLUMN) -> int:  # type: ignore[no-untyped-def]
    [row] = table.collect()
    return int(row[column])


def test_the_newest_entry_at_each_planning_bounded_by_the_floor(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    checkpoint = tmp_path / "checkpoint"
    for batch_id, watermark in ((0, 0), (1, 5_000), (9, 7_000), (10, 6_000)):
        entry(checkpoint, batch_id, watermark)
    # Spark's own side files are not entries (numbers sort as numbers: 10 > 9).
    (checkpoint / "offsets" / ".11.crc").write_text("x")
    (checkpoint / "offsets" / "12.tmp").write_text("v1\n{}")
    table = batch_clock(spark, str(checkpoint), 0)
    assert value(table) == 6_000
    # A micro-batch plans the same relation again (a new query execution): new entry.
    entry(checkpoint, 11, 8_000, 1_795_000_000_123)
    assert value(table.select("*")) == 8_000
    assert value(table.select("*"), TIME_COLUMN) == 1_795_000_000_123
    floored = batch_clock(spark, str(checkpoint), 9_500)
    assert value(floored) == 9_500  # the cut's floor
    assert value(floored, TIME_COLUMN) == 1_795_000_000_123  # the time has none
    assert [(f.name, f.dataType.simpleString()) for f in table.schema] == [
        (WATERMARK_COLUMN, "bigint"),
        (TIME_COLUMN, "bigint"),
    ]


def test_no_entry_is_an_error_not_a_zero(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(Exception, match=r"no offset log entry in .*offsets"):
        value(batch_clock(spark, str(tmp_path / "empty"), 0))


def test_corrupt_entries_are_errors_not_a_low_watermark(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A watermark of 0 would let late records into the aggregation, which drops them;
    a batch time of 0 would put every record ahead of it."""
    for n, metadata in enumerate(
        [
            "",
            "[]",
            "null",
            '{"batchWatermarkMs": null, "batchTimestampMs": 1}',
            '{"batchWatermarkMs": "5", "batchTimestampMs": 1}',
            '{"batchWatermarkMs": 5, "batchTimestampMs": "1"}',
            '{"batchWatermarkMs": 5}',
            '{"batchWatermarkMs": 5, "batchTimestampMs": 0}',
            "{} x",
        ]
    ):
        checkpoint = tmp_path / f"c{n}"
        (checkpoint / "offsets").mkdir(parents=True)
        (checkpoint / "offsets" / "0").write_text(f'v1\n{metadata}\n{{"t":{{"0":1}}}}\n')
        with pytest.raises(Exception, match="unreadable offset log entry"):
            value(batch_clock(spark, str(checkpoint), 0))
    truncated = tmp_path / "truncated"
    (truncated / "offsets").mkdir(parents=True)
    (truncated / "offsets" / "0").write_text('v1\n{"batchWatermarkMs": 5}\n')  # no offsets line
    with pytest.raises(Exception, match="unreadable offset log entry"):
        value(batch_clock(spark, str(truncated), 0))


def test_each_micro_batch_sees_its_own_watermark_and_time(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """In a stream-static join, as the pipelines use it: one file per batch, the
    watermark (no delay) moves to the newest event time of the batches before, and
    the time is the batch's in Spark's offset log (what current_timestamp() gives it).
    No record is late (a late one would leave its batch without an output row)."""
    from pyspark.sql import functions as F

    folder, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    folder.mkdir()
    times_s = [[100, 160], [400, 170], [430], [900, 440]]
    for n, times in enumerate(times_s):
        lines = "\n".join(json.dumps({"ts": t}) for t in times)
        path = folder / f"{n:03d}.json"
        path.write_text(lines + "\n")
        os.utime(path, (1_700_000_000 + n, 1_700_000_000 + n))  # Spark reads by file time
    records = (
        spark.readStream.schema("ts long")
        .option("maxFilesPerTrigger", 1)
        .json(str(folder))
        .select(F.timestamp_seconds("ts").alias("t"))
        .crossJoin(batch_clock(spark, str(checkpoint), 0))
        .withWatermark("t", "0 seconds")
    )
    seen: dict[int, set[tuple[int, int]]] = {}

    def collect(batch, batch_id: int) -> None:  # type: ignore[no-untyped-def]
        clock = batch.select(WATERMARK_COLUMN, TIME_COLUMN).distinct().collect()
        seen[batch_id] = {(int(r[0]), int(r[1])) for r in clock}

    counted = records.groupBy(F.window("t", "1 minute")).agg(
        F.max(WATERMARK_COLUMN).alias(WATERMARK_COLUMN), F.max(TIME_COLUMN).alias(TIME_COLUMN)
    )
    partitions = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "1")  # a state store each, not 200
    try:
        query = (
            counted.writeStream.outputMode("update")
            .foreachBatch(collect)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", partitions)
    query.awaitTermination(120)
    # Plain Python: batch n runs with the newest event time of batches 0..n-1, and
    # the time its offset log entry holds.
    expected, newest = {}, 0
    for n, times in enumerate(times_s):
        metadata = json.loads((checkpoint / "offsets" / str(n)).read_text().splitlines()[1])
        expected[n] = {(newest * 1000, metadata["batchTimestampMs"])}
        newest = max(newest, *times)
    assert {n: seen[n] for n in expected} == expected


@pytest.mark.parametrize("name", ["user_clicks", "inventory"])
def test_the_streams_record_code_holds_no_clock(spark, tmp_path: Path, name: str) -> None:  # type: ignore[no-untyped-def]
    """Spark makes current_timestamp() a literal of each batch's time, and code that
    holds a literal is generated and compiled again for each batch: the per-record
    judging ran in the JVM's interpreter every batch. The stream, windowed or not,
    takes its batch time from the clock's column instead."""
    from jobs.pipeline.parser import load_pipeline
    from jobs.settings import REPO_ROOT
    from jobs.streaming import analyser, query

    pipeline = load_pipeline(name, REPO_ROOT / "include" / "pipelines")
    starting = json.dumps({topic: {"0": 0} for topic in pipeline.topics})
    frame = query.build(
        spark, analyser.resolve(spark, pipeline), "127.0.0.1:9", starting, {}, str(tmp_path)
    )
    plan = frame._jdf.queryExecution().logical().toString()
    assert "current_timestamp" not in plan
    assert f"timestamp_millis({TIME_COLUMN}" in plan
