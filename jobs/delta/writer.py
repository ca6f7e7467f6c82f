"""Idempotent, fenced commits to an application's Delta tables.

Every commit of batch ``b`` in epoch ``e`` carries two Delta app transactions:

* ``<app>/epoch=<e>`` at version ``b``: the batch marker. Before writing, the
  writer reads it from the snapshot it will commit against and skips a batch
  that is already there (delta-rs records the marker but never skips by itself).
* ``<app>/fence`` at version ``e``: the epoch fence. A maintenance operation bumps
  it (``bump_epoch``); a writer whose snapshot shows a newer epoch refuses.

Because both markers are in the commit itself, the check and the write are atomic
together: if another writer commits the same batch, or bumps the epoch, between
our check and our commit, delta-rs fails our commit ("concurrent transaction")
and we look again at the new snapshot instead of duplicating or overwriting.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, RemoveAction

from jobs.delta.files import DataFile, publish
from jobs.delta.log import commit_infos
from jobs.errors import ConsistencyError, FencedError
from jobs.warehouse import Location

log = logging.getLogger(__name__)
MAX_ATTEMPTS = 5
TableOperation = Callable[[DeltaTable, CommitProperties], None]
# The commit info key of an epoch bump's own id (``bump_epoch``).
BUMP_ID = "bump_id"
# The check the holder of an application runs before each of its commits, installed
# by ``jobs/lock.py`` while it holds the application: a holder whose lease on object
# storage lapsed (frozen, cut off) commits nothing. A run's batches, committed on
# Spark's callback thread, carry theirs as ``BatchWriter.guard``.
_HOLD_CHECK: ContextVar[Callable[[], None] | None] = ContextVar("hold_check", default=None)


@contextmanager
def commits_checked_by(check: Callable[[], None]) -> Iterator[None]:
    """Every commit of this thread (and the context it copies) in the block runs
    ``check`` first."""
    token = _HOLD_CHECK.set(check)
    try:
        yield
    finally:
        _HOLD_CHECK.reset(token)


def check_hold() -> None:
    """Raise (``LeaseLostError``) when this process may no longer commit."""
    check = _HOLD_CHECK.get()
    if check is not None:
        check()


def batch_txn_id(application_id: str, epoch: int) -> str:
    # A new epoch has a new checkpoint whose batch ids restart at 0: new marker id.
    return f"{application_id}/epoch={epoch}"


def fence_txn_id(application_id: str) -> str:
    return f"{application_id}/fence"


def maintenance_fence_txn_id(application_id: str) -> str:
    """What every bump sets beside the fence, and ``maintain``'s commits carry."""
    return f"{application_id}/maintenance-fence"


def table_epoch(table: DeltaTable, application_id: str) -> int:
    version = table.transaction_version(fence_txn_id(application_id))
    return -1 if version is None else int(version)


def committed_batch(table: DeltaTable, application_id: str, epoch: int) -> int | None:
    version = table.transaction_version(batch_txn_id(application_id, epoch))
    return None if version is None else int(version)


@dataclass
class BatchWriter:
    """Commits one batch's changes, table by table, exactly once per epoch."""

    application_id: str
    epoch: int
    exactly_once: bool = True
    # Test hook: runs between the check and the commit (to provoke races).
    before_commit: Callable[[str], None] | None = None
    # Before each commit: raises when this process may no longer commit (its hold
    # on the application, a lease on object storage, was lost).
    guard: Callable[[], None] | None = None

    def _check_fence(self, table: DeltaTable, path: Location) -> None:
        current = table_epoch(table, self.application_id)
        if current > self.epoch:
            raise FencedError(
                f"application {self.application_id} moved to epoch {current}; this writer "
                f"(epoch {self.epoch}) may not commit to {path.name} any more"
            )

    def commit(
        self,
        path: Location,
        batch_id: int,
        operation: TableOperation,
        metadata: dict[str, str] | None = None,
    ) -> int | None:
        """Run ``operation`` as batch ``batch_id``'s commit to ``path``.

        Returns the new table version, or None when the batch was already there.
        """
        txns = [Transaction(fence_txn_id(self.application_id), self.epoch)]
        if self.exactly_once:
            txns.append(Transaction(batch_txn_id(self.application_id, self.epoch), batch_id))
        custom = {
            "application_id": self.application_id,
            "epoch": str(self.epoch),
            "batch_id": str(batch_id),
            **(metadata or {}),
        }
        for _attempt in range(MAX_ATTEMPTS):
            (self.guard or check_hold)()
            table = DeltaTable(str(path))
            self._check_fence(table, path)
            if self.exactly_once:
                done = committed_batch(table, self.application_id, self.epoch)
                if done is not None and done >= batch_id:
                    return None
            if self.before_commit is not None:
                self.before_commit(path.name)
            props = CommitProperties(app_transactions=txns, custom_metadata=custom)
            try:
                operation(table, props)
            except CommitFailedError:
                # delta-rs raises this type when another commit won the version (its
                # text varies): look at the new snapshot again, which tells whether the
                # batch is there now or the epoch moved on.
                continue
            return int(table.version())
        raise ConsistencyError(
            f"could not commit batch {batch_id} to {path} after {MAX_ATTEMPTS} concurrent conflicts"
        )

    def append(
        self,
        path: Location,
        batch_id: int,
        rows: pa.Table | Callable[[], pa.RecordBatchReader],
        metadata: dict[str, str] | None = None,
    ) -> int | None:
        """Append ``rows``: a table, or a factory of readers whose batches are streamed
        into the commit (bounded memory; a fresh reader for every attempt)."""

        def run(table: DeltaTable, props: CommitProperties) -> None:
            data = rows if isinstance(rows, pa.Table) else rows()
            write_deltalake(table, data, mode="append", commit_properties=props)

        return self.commit(path, batch_id, run, metadata)

    def add_files(
        self,
        path: Location,
        batch_id: int,
        files: list[DataFile],
        schema: pa.Schema,
        metadata: dict[str, str] | None = None,
    ) -> int | None:
        """Commit data files that tasks staged for ``path`` (``files.py``) as one
        append of batch ``batch_id``: the rows never pass through this process."""
        # The move is harmless for a holder that lost the application (the files'
        # names are its batch's own, and no commit of it can land), but a holder that
        # knows it lost writes nothing more.
        (self.guard or check_hold)()
        publish(path, files, schema)

        def run(table: DeltaTable, props: CommitProperties) -> None:
            actions: list[AddAction | RemoveAction] = [
                *add_actions(path, files, self.epoch, batch_id)
            ]
            table.create_write_transaction(actions, "append", schema, commit_properties=props)

        committed = self.commit(path, batch_id, run, metadata)
        if committed is None:
            return None
        # The transaction does not move the table object on: find our commit.
        version = find_commit_version(path, self.application_id, self.epoch, batch_id, limit=20)
        if version is None:
            log.warning("%s: the commit of batch %d is not among the newest 20", path, batch_id)
        return version

    def merge(
        self,
        path: Location,
        batch_id: int,
        rows: pa.Table | Callable[[], pa.Table | pa.RecordBatchReader],
        keys: tuple[str, ...],
        metadata: dict[str, str] | None = None,
        within: str | None = None,
    ) -> int | None:
        """Upsert ``rows`` on ``keys`` (the state table: current value per key); a
        reader factory streams them (a fresh reader for every attempt).

        ``within``: a condition on the target rows that every row matching a source
        row meets (``window_range``). delta-rs then reads only the files it can
        touch; from its keys alone it reads far more (a 1,000-row merge into 10M
        windowed rows: 0.94 s on the keys, 0.08 s with the window range)."""
        predicate = " AND ".join(f"t.`{k}` = s.`{k}`" for k in keys)
        if within is not None:
            predicate = f"{predicate} AND ({within})"

        def run(table: DeltaTable, props: CommitProperties) -> None:
            (
                table.merge(
                    rows if isinstance(rows, pa.Table) else rows(),
                    predicate,
                    source_alias="s",
                    target_alias="t",
                    commit_properties=props,
                )
                .when_matched_update_all()
                .when_not_matched_insert_all()
                .execute()
            )

        return self.commit(path, batch_id, run, metadata)


def window_range(column: str, values: pa.ChunkedArray | pa.Array) -> str | None:
    """The condition ``t.<column>`` between the smallest and largest of ``values``
    (timestamps): exact to the microsecond, so no matching row falls outside it
    (a row outside would not match, and the merge would insert its key twice)."""
    lowest, highest = pc.min_max(values.cast(pa.timestamp("us", tz="UTC"))).values()
    if not lowest.is_valid:
        return None
    # Microseconds since the epoch, typed as the column is: no text form of a time.
    low, high = (
        f"arrow_cast({v.value}, 'Timestamp(Microsecond, Some(\"UTC\"))')" for v in (lowest, highest)
    )
    return f"t.`{column}` BETWEEN {low} AND {high}"


def add_actions(
    table: Location, files: list[DataFile], epoch: int, batch_id: int
) -> list[AddAction]:
    """The Delta add actions of one batch's data files in ``table``. Statistics: row
    counts, and the batch's epoch and id (the same in every row), so that a reader
    of one batch skips every other file."""
    constant = {"epoch": epoch, "batch_id": batch_id}
    return [
        AddAction(
            path=f.name,
            size=f.size,
            partition_values={},
            modification_time=_modified_ms(table / f.name),
            data_change=True,
            stats=json.dumps(
                {
                    "numRecords": f.num_records,
                    "minValues": constant,
                    "maxValues": constant,
                    "nullCount": {"epoch": 0, "batch_id": 0},
                }
            ),
        )
        for f in files
    ]


def _modified_ms(data_file: Location) -> int:
    found = data_file.stat()
    if found is None:
        raise ConsistencyError(
            f"data file {data_file} is gone before its commit (a run replays it)"
        )
    return int(found.modified_s * 1000)


def bump_epoch(
    paths: list[Location],
    application_id: str,
    new_epoch: int,
    reason: str,
    first_rows: pa.Table | None = None,
) -> None:
    """Fence every writer of an older epoch: a commit carrying the new fence.

    ``paths`` in order; the ledger first, so that no old-epoch batch can complete
    once the bump has started. ``first_rows`` (the operation's audit row) become the
    first table's bump commit; the others are empty commits. A table already at a
    newer epoch is an error.
    """
    bump_id = uuid.uuid4().hex  # tells this bump's commits from another holder's
    for i, path in enumerate(paths):
        read: int | None = None
        for _attempt in range(MAX_ATTEMPTS):
            table = DeltaTable(str(path))
            current = table_epoch(table, application_id)
            if current >= new_epoch:
                if read is not None and own_commit(path, read, BUMP_ID, bump_id):
                    break  # this bump's own commit, whose answer was lost
                raise FencedError(
                    f"application {application_id} moved to epoch {current} ({path.name}) "
                    f"before this bump to epoch {new_epoch}: another holder overtook it, and "
                    "it commits nothing"
                )
            read = table.version()
            check_hold()
            rows = first_rows if i == 0 and first_rows is not None else None
            if rows is None:
                rows = pa.Table.from_batches([], schema=pa.schema(table.schema().to_arrow()))
            props = CommitProperties(
                app_transactions=[
                    Transaction(fence_txn_id(application_id), new_epoch),
                    Transaction(maintenance_fence_txn_id(application_id), new_epoch),
                ],
                custom_metadata={
                    "application_id": application_id,
                    "platform_operation": "epoch_bump",
                    "epoch": str(new_epoch),
                    "reason": reason,
                    BUMP_ID: bump_id,
                },
            )
            try:
                write_deltalake(table, rows, mode="append", commit_properties=props)
            except CommitFailedError:
                continue  # another commit won the version: look again
            break
        else:
            raise ConsistencyError(f"could not bump the epoch of {path}: too many conflicts")


def own_commit(path: Location, after: int, key: str, value: str) -> bool:
    """A commit after version ``after`` whose commit info has ``key`` = ``value``."""
    return any(info.get(key) == value for info in commit_infos(path, after + 1).values())


@dataclass(frozen=True)
class OperationFence:
    """An operation's commits in its (new) epoch, tagged with the operation (and
    its reason and versions) in the commit info.

    ``on(table)`` gives the properties of one commit made on ``table``'s snapshot,
    and refuses (``FencedError``) when that snapshot's fence is past this epoch: a
    newer holder bumped it while this one was paused. A bump that lands after the
    read fails the commit itself (both carry the ``<app>/fence`` transaction, which
    delta-rs' conflict check covers). So the store, not a check before it, refuses a
    stale operation's write, and the fence never goes back: a commit carrying an
    older epoch's fence would set it back."""

    application_id: str
    epoch: int
    operation: str
    tags: Mapping[str, str] = field(default_factory=dict)
    # The transaction the commit carries: the fence itself, or (``maintain``, which
    # must not conflict with a running stream's batches) the maintenance fence that
    # every bump also sets: a bump then still fails the commit, a batch does not.
    carries: Literal["fence", "maintenance"] = "fence"

    def on(self, table: DeltaTable) -> CommitProperties:
        check_hold()
        current = table_epoch(table, self.application_id)
        if current > self.epoch:
            raise FencedError(
                f"application {self.application_id} moved to epoch {current}; this "
                f"{self.operation} (epoch {self.epoch}) commits nothing more to "
                f"{Location.parse(table.table_uri).name}"
            )
        carried = (
            fence_txn_id(self.application_id)
            if self.carries == "fence"
            else maintenance_fence_txn_id(self.application_id)
        )
        return CommitProperties(
            app_transactions=[Transaction(carried, self.epoch)],
            custom_metadata={
                "application_id": self.application_id,
                "platform_operation": self.operation,
                "epoch": str(self.epoch),
                **self.tags,
            },
        )


def find_commit_version(
    path: Location, application_id: str, epoch: int, batch_id: int, limit: int | None = None
) -> int | None:
    """The table version that committed batch ``batch_id`` of ``epoch``, from the
    log (the newest ``limit`` commits, or all)."""
    first = 0 if limit is None else max(0, DeltaTable(str(path)).version() - limit + 1)
    for version, info in commit_infos(path, first).items():
        if (
            info.get("application_id") == application_id
            and info.get("epoch") == str(epoch)
            and info.get("batch_id") == str(batch_id)
        ):
            return version
    return None
