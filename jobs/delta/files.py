"""Data files that Spark's tasks write and the driver commits.

An append on a cluster: each task writes its Parquet file straight into the
table's folder (the warehouse is shared storage), and tells the driver its name,
size and row count, a few bytes. The driver commits the files in one Delta
transaction with the batch's markers (``BatchWriter.add_files``), so it never
holds the rows. A file is visible to readers only once a commit references it; a
file whose batch never commits is an orphan, which ``maintain``'s vacuum removes
once it is older than the reader grace period.

Names carry the epoch and batch (and the task or offset range) for people, plus a
random part: a retried or speculative task never replaces a file that another
attempt may have reported, and vacuum, deciding by age, never races a rewrite.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

# What a data file may be called: a plain name in the table's root folder.
FILE_NAME = re.compile(r"^part-[A-Za-z0-9._=-]+\.parquet$")


@dataclass(frozen=True)
class DataFile:
    name: str  # relative to the table's root
    size: int
    num_records: int


def _checked(name: str) -> str:
    if not FILE_NAME.match(name):
        raise ValueError(f"invalid data file name {name!r}")
    return name


class DataFileWriter:
    """Streams record batches into ``table/name``: written under a hidden temporary
    name (vacuum and readers never take it for data), renamed when complete."""

    def __init__(self, table: Path, name: str, schema: pa.Schema, eager: bool = False) -> None:
        self.table = table
        self.name = _checked(name)
        self.schema = schema
        self._tmp = table / f".{name}.tmp"
        self._writer: pq.ParquetWriter | None = None
        if eager:  # the file exists even without a row
            self._open()

    def _open(self) -> pq.ParquetWriter:
        if self._writer is None:
            self._writer = pq.ParquetWriter(self._tmp, self.schema, compression="snappy")
        return self._writer

    def write(self, rows: pa.Table | pa.RecordBatch) -> None:
        if rows.num_rows:
            self._open().write(rows)

    def close(self) -> DataFile | None:
        """The file written, or None when no row came (and not ``eager``)."""
        if self._writer is None:
            return None
        self._writer.close()
        os.replace(self._tmp, self.table / self.name)
        return describe(self.table, self.name)

    def abort(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._tmp.unlink(missing_ok=True)


def describe(table: Path, name: str) -> DataFile:
    path = table / _checked(name)
    return DataFile(name, path.stat().st_size, pq.read_metadata(path).num_rows)
