"""Data files that Spark's tasks write and the driver commits.

An append on a cluster: each task writes its Parquet file into the table's
``_staging`` folder (the warehouse is shared storage) and tells the driver its
name, size and row count, a few bytes. The driver moves exactly the files it was
told about into the table's folder, stamped with the current time, and commits
them at once in one Delta transaction with the batch's markers
(``BatchWriter.add_files``): it never holds the rows.

Why a staging folder: vacuum removes unreferenced files by age, and a batch may
take longer than the reader grace period between its tasks' writes and its
commit. Vacuum never looks into ``_staging`` (a hidden folder for Delta), and a
file reaches the table's folder only moments before its commit. Staged files of
batches that can no longer commit (an older epoch, or a batch the ledger already
has) are deleted by name (``stale_staged_files``, run by ``maintain``); a file
moved in but never committed (a crash in between) is an orphan that vacuum
removes once it is older than the vacuum retention.

Names carry the epoch and batch (and the task or offset range), plus a random
part: a retried or speculative task never replaces a file that another attempt
may have reported.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from jobs.errors import ConsistencyError

STAGING = "_staging"
ROW_GROUP_BYTES = 16 * 2**20
# What a data file may be called: a plain name, with its epoch and batch.
FILE_NAME = re.compile(r"^part-e(\d+)-b(\d+)-[A-Za-z0-9._=-]+\.parquet$")
# A staged file or a task's temporary file (hidden: ``.<name>.tmp``).
STAGED_NAME = re.compile(r"^\.?part-e(\d+)-b(\d+)-")


@dataclass(frozen=True)
class DataFile:
    name: str  # relative to the table's root once published
    size: int
    num_records: int


def _checked(name: str) -> str:
    if not FILE_NAME.match(name):
        raise ValueError(f"invalid data file name {name!r}")
    return name


def staging(table: Path) -> Path:
    return table / STAGING


class DataFileWriter:
    """Streams record batches into ``table/_staging/name``: under a hidden temporary
    name first, renamed when complete (a reader of the folder never sees half)."""

    def __init__(self, table: Path, name: str, schema: pa.Schema, eager: bool = False) -> None:
        self.folder = staging(table)
        self.name = _checked(name)
        self.schema = schema
        self._tmp = self.folder / f".{name}.tmp"
        self._writer: pq.ParquetWriter | None = None
        if eager:  # the file exists even without a row
            self._open()

    def _open(self) -> pq.ParquetWriter:
        if self._writer is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._writer = pq.ParquetWriter(self._tmp, self.schema, compression="snappy")
        return self._writer

    def write(self, rows: pa.Table | pa.RecordBatch) -> None:
        """Append ``rows`` as row groups of at most ``ROW_GROUP_BYTES``: a reader
        (Spark's Parquet reader holds a whole row group's column chunks) then
        needs little memory whatever the record size (10,000 records of 10 KB
        would otherwise be one 100 MB row group)."""
        if not rows.num_rows:
            return
        per_group = max(1, rows.num_rows * ROW_GROUP_BYTES // max(1, rows.nbytes))
        writer = self._open()
        for start in range(0, rows.num_rows, per_group):
            writer.write(rows.slice(start, per_group))

    def close(self) -> DataFile | None:
        """The file written, or None when no row came (and not ``eager``)."""
        if self._writer is None:
            return None
        self._writer.close()
        os.replace(self._tmp, self.folder / self.name)
        return describe(self.folder, self.name)

    def abort(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._tmp.unlink(missing_ok=True)


def describe(folder: Path, name: str) -> DataFile:
    path = folder / _checked(name)
    return DataFile(name, path.stat().st_size, pq.read_metadata(path).num_rows)


def publish(table: Path, files: list[DataFile], schema: pa.Schema) -> None:
    """Move staged ``files`` into the table's folder, stamped now (vacuum judges by
    age), checking that each holds ``schema``'s columns and types: a file Delta's
    readers could not read back is never committed."""
    for f in files:
        staged, target = staging(table) / _checked(f.name), table / f.name
        if staged.exists():
            found = pq.read_schema(staged)
            if [(x.name, x.type) for x in found] != [(x.name, x.type) for x in schema]:
                raise ConsistencyError(f"{staged} holds {found}, not the table's columns {schema}")
            # Stamped before the move: the file never shows in the table's folder with
            # its (possibly old) write time, where vacuum judges by age.
            os.utime(staged)
            os.replace(staged, target)
        elif not target.exists():  # an earlier attempt of this commit moved it
            raise ConsistencyError(
                f"staged data file {staged} is gone; the batch is not committed (a run replays it)"
            )


def stale_staged_files(table: Path, epoch: int, last_committed: int | None) -> list[Path]:
    """Staged files (and tasks' temporary files) of batches that can no longer
    commit: an older epoch's (fenced), or a batch of ``epoch`` at or before the last
    one the ledger committed (a replay of it skips)."""
    folder = staging(table)
    if not folder.is_dir():
        return []
    stale = []
    for path in folder.iterdir():
        found = STAGED_NAME.match(path.name)
        if found is None:
            continue
        file_epoch, batch = int(found.group(1)), int(found.group(2))
        if file_epoch < epoch or (
            file_epoch == epoch and last_committed is not None and batch <= last_committed
        ):
            stale.append(path)
    return sorted(stale)
