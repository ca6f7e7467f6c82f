"""Each micro-batch's event-time watermark as a one-row table joined to its records.

Records whose window the watermark has closed are dead letters (``late:``) rather
than rows Spark's aggregation drops silently; ``classify`` needs the watermark the
batch runs with, the same on a replay. Spark writes a batch's entry in the offset
log (with ``batchWatermarkMs``) before it plans the batch, and the next entry only
after the batch's commit, so the newest entry is the running batch's. The source
(``include/jvm/sources/platform/streaming/BatchWatermarkSource.java``) reads it on
the driver while the batch is planned: the static side of a stream-static join is
planned again for every micro-batch (tested: each batch sees its own entry). The
cut's floor (the watermark the application had reached before an operation
restarted it) bounds it from below.

A JVM source: a Python data source cost a cold run 1.5-2.6 s (a Python worker to
look it up and create it, another to read it, docs/benchmarks.md).
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

FORMAT = "platform.streaming.BatchWatermarkSource"
COLUMN = "_batch_watermark_ms"


def batch_watermark(spark: SparkSession, checkpoint: str, floor_ms: int) -> DataFrame:
    """One row, ``_batch_watermark_ms``: to cross-join (broadcast) to a batch's records."""
    table = (
        spark.read.format(FORMAT)
        .option("checkpoint", checkpoint)
        .option("floorMs", str(floor_ms))
        .load()
    )
    return F.broadcast(table)
