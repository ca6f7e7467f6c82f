"""The tasks' half of a batch's appends: each task of a DataFrame (the batch's
output for the changelog, its records read again for the raw archive) writes its
rows as one Parquet file in the table's folder and returns the file's name, size
and row count (``jobs/delta/files.py``); the driver commits the files. The driver
never collects the rows.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from jobs.delta.files import DataFileWriter
from jobs.faults import maybe_crash
from jobs.warehouse import Location

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

# What each task returns to the driver.
WRITTEN_SCHEMA = "name string, size long, num_records long"
# The Spark job group of the job that starts the Python workers (Spark's UI shows it).
WORKERS_JOB_GROUP = "platform-python-workers"


@dataclass(frozen=True)
class StagedFilesTask:
    """A ``mapInArrow`` function (pickled to the executors)."""

    table: str
    epoch: int
    batch_id: int
    input_schema: pa.Schema  # the rows' columns (cast to these types)
    schema: pa.Schema  # the table's: the input's columns, then the stamp's
    stamp: tuple[tuple[str, int], ...]  # columns every row of the batch shares
    write: bool  # False: the batch's rows are committed already (a replay)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        if not self.write:
            for _ in batches:  # the batch must still run: Spark's state advances
                pass
            return
        from pyspark import TaskContext

        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        # Unique per attempt (see files.py); the driver commits the ones it got.
        name = (
            f"part-e{self.epoch}-b{self.batch_id}-c{partition:05d}-{uuid.uuid4().hex[:16]}.parquet"
        )
        out = DataFileWriter(Location(self.table), name, self.schema)
        try:
            for batch in batches:
                out.write(self._stamped(batch))
                maybe_crash("during_task", self.batch_id)
            written = out.close()
        except BaseException:
            out.abort()
            raise
        if written is not None:
            yield pa.RecordBatch.from_pylist(
                [{"name": written.name, "size": written.size, "num_records": written.num_records}]
            )

    def _stamped(self, batch: pa.RecordBatch) -> pa.Table:
        rows = pa.Table.from_batches([batch]).select(self.input_schema.names)
        rows = rows.cast(self.input_schema)
        n = rows.num_rows
        columns = [
            *rows.columns,
            *(pa.array([value] * n, self.schema.field(name).type) for name, value in self.stamp),
        ]
        return pa.Table.from_arrays(columns, schema=self.schema)


def start_workers(spark: SparkSession) -> threading.Thread:
    """Start Spark's Python workers for these tasks before a batch needs them: in a
    new process, starting one took about 1.4 s and its imports (pyarrow's Parquet)
    about 1 s, on the batch's path after its Kafka stage (docs/benchmarks.md,
    "Issue 45"). A tiny job of one task per task slot, in a thread, while the run
    prepares; Spark keeps idle workers for reuse (for a minute). A failure only
    means the batch starts its own."""

    def run() -> None:
        try:
            slots = spark.sparkContext.defaultParallelism
            spark.sparkContext.setJobGroup(WORKERS_JOB_GROUP, "start Python workers ahead")
            spark.range(0, slots, numPartitions=slots).mapInArrow(
                _started, WRITTEN_SCHEMA
            ).collect()
        except Exception:  # the session stopped, say: the batch starts its own
            log.debug("Python workers not started ahead", exc_info=True)

    thread = threading.Thread(target=run, name="python-workers", daemon=True)
    thread.start()
    return thread


def _started(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A warm-up task: this module (its imports) loaded in a Python worker."""
    for _ in batches:
        pass
    yield from ()
