"""The JVM batch-watermark source (include/jvm/sources): the newest offset log
entry's watermark, read again each time the one-row table is planned."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from jobs.streaming.batch_watermark import COLUMN, batch_watermark

pytestmark = pytest.mark.integration


def entry(checkpoint: Path, batch_id: int, watermark_ms: int) -> None:
    offsets = checkpoint / "offsets"
    offsets.mkdir(parents=True, exist_ok=True)
    metadata = {"batchWatermarkMs": watermark_ms, "batchTimestampMs": 1, "conf": {}}
    (offsets / str(batch_id)).write_text(f'v1\n{json.dumps(metadata)}\n{{"t":{{"0":1}}}}\n')


def value(table) -> int:  # type: ignore[no-untyped-def]
    [row] = table.collect()
    return int(row[COLUMN])


def test_the_newest_entry_at_each_planning_bounded_by_the_floor(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    checkpoint = tmp_path / "checkpoint"
    for batch_id, watermark in ((0, 0), (1, 5_000), (9, 7_000), (10, 6_000)):
        entry(checkpoint, batch_id, watermark)
    # Spark's own side files are not entries (numbers sort as numbers: 10 > 9).
    (checkpoint / "offsets" / ".11.crc").write_text("x")
    (checkpoint / "offsets" / "12.tmp").write_text("v1\n{}")
    table = batch_watermark(spark, str(checkpoint), 0)
    assert value(table) == 6_000
    # A micro-batch plans the same relation again (a new query execution): new entry.
    entry(checkpoint, 11, 8_000)
    assert value(table.select("*")) == 8_000
    assert value(batch_watermark(spark, str(checkpoint), 9_500)) == 9_500  # the cut's floor
    assert table.schema[COLUMN].dataType.simpleString() == "bigint"


def test_no_entry_is_an_error_not_a_zero(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(Exception, match=r"no offset log entry in .*offsets"):
        value(batch_watermark(spark, str(tmp_path / "empty"), 0))


def test_corrupt_entries_are_errors_not_a_low_watermark(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A watermark of 0 would let late records into the aggregation, which drops them."""
    for n, metadata in enumerate(
        ["", "[]", "null", '{"batchWatermarkMs": null}', '{"batchWatermarkMs": "5"}', "{} x"]
    ):
        checkpoint = tmp_path / f"c{n}"
        (checkpoint / "offsets").mkdir(parents=True)
        (checkpoint / "offsets" / "0").write_text(f'v1\n{metadata}\n{{"t":{{"0":1}}}}\n')
        with pytest.raises(Exception, match="unreadable offset log entry"):
            value(batch_watermark(spark, str(checkpoint), 0))
    truncated = tmp_path / "truncated"
    (truncated / "offsets").mkdir(parents=True)
    (truncated / "offsets" / "0").write_text('v1\n{"batchWatermarkMs": 5}\n')  # no offsets line
    with pytest.raises(Exception, match="unreadable offset log entry"):
        value(batch_watermark(spark, str(truncated), 0))


def test_each_micro_batch_sees_its_own_watermark(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """In a stream-static join, as the pipelines use it: one file per batch, the
    watermark (no delay) moves to the newest event time of the batches before. No
    record is late (a late one would leave its batch without an output row)."""
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
        .crossJoin(batch_watermark(spark, str(checkpoint), 0))
        .withWatermark("t", "0 seconds")
    )
    seen: dict[int, set[int]] = {}

    def collect(batch, batch_id: int) -> None:  # type: ignore[no-untyped-def]
        seen[batch_id] = {int(r[0]) for r in batch.select(COLUMN).distinct().collect()}

    counted = records.groupBy(F.window("t", "1 minute")).agg(F.max(COLUMN).alias(COLUMN))
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
    # Plain Python: batch n runs with the newest event time of batches 0..n-1.
    expected, newest = {}, 0
    for n, times in enumerate(times_s):
        expected[n] = {newest * 1000}
        newest = max(newest, *times)
    assert {n: seen[n] for n in expected} == expected
