"""Each micro-batch's clock, its event-time watermark and its batch time, as a one-row
table joined to its records.

Records whose window the watermark has closed are dead letters (``late:``) rather
than rows Spark's aggregation drops silently, and records too far ahead of the batch
time are dead letters too; ``classify`` needs both as the batch runs with them, the
same on a replay. Spark writes a batch's entry in the offset log (with
``batchWatermarkMs`` and ``batchTimestampMs``) before it plans the batch, and the
next entry only after the batch's commit, so the newest entry is the running batch's.
The source (``include/jvm/sources/platform/streaming/BatchClockSource.java``) reads it
on the driver while the batch is planned: the static side of a stream-static join is
planned again for every micro-batch (tested: each batch sees its own entry). The
cut's floor (the watermark the application had reached before an operation
restarted it) bounds the watermark from below.

Columns, not constants: Spark makes ``current_timestamp()`` a literal of each batch's
time, so the per-record code was generated and compiled again for every batch, and
ran in the JVM's interpreter until its JIT caught up (docs/benchmarks.md).

A JVM source: a Python data source cost a cold run 1.5-2.6 s (a Python worker to
look it up and create it, another to read it, docs/benchmarks.md).
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

FORMAT = "platform.streaming.BatchClockSource"
WATERMARK_COLUMN = "_batch_watermark_ms"
TIME_COLUMN = "_batch_time_ms"


def batch_clock(spark: SparkSession, checkpoint: str, floor_ms: int) -> DataFrame:
    """One row, ``_batch_watermark_ms`` and ``_batch_time_ms``: to cross-join
    (broadcast) to a batch's records."""
    table = (
        spark.read.format(FORMAT)
        .option("checkpoint", checkpoint)
        .option("floorMs", str(floor_ms))
        .load()
    )
    return F.broadcast(table)
