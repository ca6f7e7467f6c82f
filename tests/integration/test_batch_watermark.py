"""The JVM batch-watermark source (include/jvm/sources): the newest offset log
entry's watermark, read again each time the one-row table is planned."""

from __future__ import annotations

import json
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
