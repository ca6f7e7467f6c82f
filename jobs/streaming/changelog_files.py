"""The tasks' half of a batch's changelog append: each task of the batch's output
writes its rows as one Parquet file in the changelog table's folder and returns
the file's name, size and row count (``jobs/delta/files.py``); the driver commits
the files. The driver never collects the rows.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from jobs.delta.files import DataFileWriter

# What each task returns to the driver.
WRITTEN_SCHEMA = "name string, size long, num_records long"


@dataclass(frozen=True)
class ChangelogTask:
    """A ``mapInArrow`` function (pickled to the executors)."""

    table: str
    epoch: int
    batch_id: int
    commit_time_us: int
    aggregate_schema: pa.Schema
    schema: pa.Schema  # the changelog's: aggregates, epoch, batch_id, commit_time
    write: bool  # False: the batch's changelog is committed already (a replay)

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
        out = DataFileWriter(Path(self.table), name, self.schema)
        try:
            for batch in batches:
                out.write(self._stamped(batch))
            written = out.close()
        except BaseException:
            out.abort()
            raise
        if written is not None:
            yield pa.RecordBatch.from_pylist(
                [{"name": written.name, "size": written.size, "num_records": written.num_records}]
            )

    def _stamped(self, batch: pa.RecordBatch) -> pa.Table:
        rows = pa.Table.from_batches([batch]).cast(self.aggregate_schema)
        n = rows.num_rows
        columns = [
            *rows.columns,
            pa.array([self.epoch] * n, pa.int64()),
            pa.array([self.batch_id] * n, pa.int64()),
            pa.array([self.commit_time_us] * n, self.schema.field("commit_time").type),
        ]
        return pa.Table.from_arrays(columns, schema=self.schema)
