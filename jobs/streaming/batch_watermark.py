"""Each micro-batch's event-time watermark as a one-row table joined to its records.

Records whose window the watermark has closed are dead letters (``late:``) rather
than rows Spark's aggregation drops silently; ``classify`` needs the watermark the
batch runs with, the same on a replay. Spark writes a batch's entry in the offset
log (with ``batchWatermarkMs``) before it plans the batch, and the next entry only
after the batch's commit, so the newest entry is the running batch's. The
``platform_batch_watermark`` batch source reads it when the batch runs: the static
side of a stream-static join is planned again for every micro-batch (tried: each of
four batches saw its own entry). The cut's floor (the watermark the application
had reached before an operation restarted it) bounds it from below.
"""

from __future__ import annotations

from collections.abc import Iterator

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

FORMAT = "platform_batch_watermark"
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


class BatchWatermarkSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return f"{COLUMN} long"

    def reader(self, schema: StructType) -> DataSourceReader:
        return BatchWatermarkReader(str(self.options["checkpoint"]), int(self.options["floorMs"]))


class BatchWatermarkReader(DataSourceReader):
    def __init__(self, checkpoint: str, floor_ms: int) -> None:
        self.checkpoint = checkpoint
        self.floor_ms = floor_ms

    def read(self, partition: InputPartition) -> Iterator[tuple[int]]:
        from pathlib import Path

        from jobs.errors import SourceError
        from jobs.streaming import offset_log

        checkpoint = Path(self.checkpoint)
        batches = offset_log.offset_batches(checkpoint)
        if not batches:
            raise SourceError(f"no offset log entry in {checkpoint} for the running batch")
        entry = offset_log.read_offsets(checkpoint, batches[-1])
        yield (max(entry.watermark_ms, self.floor_ms),)
