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

import re
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from jobs.errors import ConsistencyError
from jobs.warehouse import Location

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
    if not FILE_NAME.fullmatch(name):
        raise ValueError(f"invalid data file name {name!r}")
    return name


def staging(table: Location) -> Location:
    return table / STAGING


class DataFileWriter:
    """Streams record batches into ``table/_staging/name``: into a file on this
    machine first, landed whole when complete (a reader of the folder never sees
    half: ``Location.landing``)."""

    def __init__(self, table: Location, name: str, schema: pa.Schema, eager: bool = False) -> None:
        self.target = staging(table) / _checked(name)
        self.name = name
        self.schema = schema
        self._landing = self.target.landing()
        self._writer: pq.ParquetWriter | None = None
        if eager:  # the file exists even without a row
            self._open()

    def _open(self) -> pq.ParquetWriter:
        if self._writer is None:
            self._writer = pq.ParquetWriter(self._landing.path, self.schema, compression="snappy")
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
            self._landing.discard()
            return None
        self._writer.close()
        written = DataFile(
            self.name,
            self._landing.path.stat().st_size,
            pq.read_metadata(self._landing.path).num_rows,
        )
        self._landing.land()
        return written

    def abort(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._landing.discard()


def publish(table: Location, files: list[DataFile], schema: pa.Schema) -> None:
    """Move staged ``files`` into the table's folder, stamped now (vacuum judges by
    age), checking that each holds
    ``schema``'s columns and types: a file Delta's readers could not read back is
    never committed."""
    for f in files:
        staged, target = staging(table) / _checked(f.name), table / f.name
        if staged.stat() is not None:
            with staged.open_reader() as handle:
                found = pq.read_schema(handle)
            if [(x.name, x.type) for x in found] != [(x.name, x.type) for x in schema]:
                raise ConsistencyError(f"{staged} holds {found}, not the table's columns {schema}")
            # Stamped now: the file never shows in the table's folder with its
            # (possibly old) write time, where vacuum judges by age.
            staged.move_to(target)
        elif target.stat() is None:  # an earlier attempt of this commit moved it
            raise ConsistencyError(
                f"staged data file {staged} is gone; the batch is not committed (a run replays it)"
            )


def stale_staged_files(table: Location, epoch: int, last_committed: int | None) -> list[Location]:
    """Staged files (and tasks' temporary files) of batches that can no longer
    commit: an older epoch's (fenced), or a batch of ``epoch`` at or before the last
    one the ledger committed (a replay of it skips)."""
    stale = []
    for path in staging(table).iterdir():
        found = STAGED_NAME.match(path.name)
        if found is None:
            continue
        file_epoch, batch = int(found.group(1)), int(found.group(2))
        if file_epoch < epoch or (
            file_epoch == epoch and last_committed is not None and batch <= last_committed
        ):
            stale.append(path)
    return sorted(stale)
