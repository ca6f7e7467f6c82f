"""Idempotent, fenced commits to an application's Delta tables, by either engine.

Every commit of batch ``b`` in epoch ``e`` carries the batch marker, a Delta app
transaction ``<app>/epoch=<e>`` at version ``b``:

* delta-spark appends (``append_frame``: the changelog, the raw archive) give it
  as ``txnAppId``/``txnVersion``; Delta itself skips a batch already there.
* delta-rs commits (the state merge, dead letters, the ledger) read it from the
  snapshot they commit against and skip a batch already there; they also carry
  ``<app>/fence`` at version ``e``, the epoch fence.

Fencing: a maintenance operation's bump (``bump_epoch``) commits, on every table,
``<app>/fence`` at the new epoch and the marker of every older epoch at
``FENCED``, a version no batch reaches. A writer of an older epoch then cannot
commit: a delta-spark append that reads its marker after the bump is skipped by
Delta (its version is below ``FENCED``) and one that read it before fails with
Delta's ``ConcurrentTransactionException`` (the bump set an app id it read); a
delta-rs commit sees the fence, or fails as a concurrent transaction. Either way
the check and the write are one atomic commit: the writer looks again and finds
the epoch fenced (``FencedError``), or its batch there.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError

from jobs.delta.log import commit_actions
from jobs.errors import ConsistencyError, FencedError

if TYPE_CHECKING:  # Spark-free tools import this module: no pyspark at run time
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)
MAX_ATTEMPTS = 5
# The marker version of a fenced epoch: above any batch id.
FENCED = 2**63 - 1
# Delta's (JVM) exceptions when another commit won: look again at the new snapshot.
SPARK_CONFLICTS = (
    "ConcurrentTransactionException",
    "ConcurrentAppendException",
    "MetadataChangedException",
    "ProtocolChangedException",
    "ConcurrentDeleteReadException",
    "ConcurrentDeleteDeleteException",
)
TableOperation = Callable[[DeltaTable, CommitProperties], None]


def batch_txn_id(application_id: str, epoch: int) -> str:
    # A new epoch has a new checkpoint whose batch ids restart at 0: new marker id.
    return f"{application_id}/epoch={epoch}"


def fence_txn_id(application_id: str) -> str:
    return f"{application_id}/fence"


def table_epoch(table: DeltaTable, application_id: str) -> int:
    version = table.transaction_version(fence_txn_id(application_id))
    return -1 if version is None else int(version)


def committed_batch(table: DeltaTable, application_id: str, epoch: int) -> int | None:
    """The last batch of ``epoch`` committed to ``table``, or None; an epoch that a
    bump fenced raises ``FencedError`` (its writers may not go on)."""
    version = table.transaction_version(batch_txn_id(application_id, epoch))
    if version is not None and int(version) == FENCED:
        raise FencedError(
            f"application {application_id} moved on from epoch {epoch}; its writers may "
            f"not commit to {Path(table.table_uri).name} any more"
        )
    return None if version is None else int(version)


@dataclass
class BatchWriter:
    """Commits one batch's changes, table by table, exactly once per epoch."""

    application_id: str
    epoch: int
    exactly_once: bool = True
    # Test hook: runs between the check and the commit (to provoke races).
    before_commit: Callable[[str], None] | None = None

    def _check_fence(self, table: DeltaTable, path: Path) -> None:
        current = table_epoch(table, self.application_id)
        if current > self.epoch:
            raise FencedError(
                f"application {self.application_id} moved to epoch {current}; this writer "
                f"(epoch {self.epoch}) may not commit to {path.name} any more"
            )

    def commit(
        self,
        path: Path,
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
        path: Path,
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

    def append_frame(
        self,
        path: Path,
        batch_id: int,
        frame: DataFrame,
        metadata: dict[str, str] | None = None,
    ) -> tuple[int | None, bool]:
        """Append a Spark DataFrame with delta-spark as batch ``batch_id``: Spark's
        tasks write the files, Delta commits them with the batch marker.

        Returns (the new table version or None when the batch was there already,
        whether ``frame`` was computed). A caller whose frame must run anyway (a
        streaming batch: its state advances) runs it when it was not.
        """
        app_id = batch_txn_id(self.application_id, self.epoch)
        stamp = json.dumps(
            {
                "application_id": self.application_id,
                "epoch": str(self.epoch),
                "batch_id": str(batch_id),
                **(metadata or {}),
            },
            sort_keys=True,
        )
        ran = False
        for _attempt in range(MAX_ATTEMPTS):
            table = DeltaTable(str(path))
            self._check_fence(table, path)
            done = committed_batch(table, self.application_id, self.epoch)
            if self.exactly_once and done is not None and done >= batch_id:
                return None, ran
            # At least once: a replay commits again, so its version must be new.
            version = batch_id if self.exactly_once else (-1 if done is None else done) + 1
            if self.before_commit is not None:
                self.before_commit(path.name)
            try:
                (
                    frame.write.format("delta")
                    .mode("append")
                    .option("txnAppId", app_id)
                    .option("txnVersion", version)
                    .option("userMetadata", stamp)
                    .save(str(path))
                )
            except Exception as exc:  # py4j carries Delta's exception by its name
                ran = True
                if not any(name in str(exc) for name in SPARK_CONFLICTS):
                    raise
                continue
            committed = find_stamped_commit(path, stamp, table.version())
            if committed is not None:
                return committed, True
            # Delta skipped the write without running it: the marker moved since
            # our look (the batch committed by another writer, or the epoch fenced).
        raise ConsistencyError(
            f"could not commit batch {batch_id} to {path} after {MAX_ATTEMPTS} concurrent conflicts"
        )

    def merge(
        self,
        path: Path,
        batch_id: int,
        rows: pa.Table | Callable[[], pa.Table | pa.RecordBatchReader],
        keys: tuple[str, ...],
        metadata: dict[str, str] | None = None,
    ) -> int | None:
        """Upsert ``rows`` on ``keys`` (the state table: current value per key); a
        reader factory streams them (a fresh reader for every attempt)."""
        predicate = " AND ".join(f"t.`{k}` = s.`{k}`" for k in keys)

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


def bump_epoch(
    paths: list[Path],
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
    for i, path in enumerate(paths):
        for _attempt in range(MAX_ATTEMPTS):
            table = DeltaTable(str(path))
            current = table_epoch(table, application_id)
            if current >= new_epoch:
                raise FencedError(
                    f"{path.name} of {application_id} is at epoch {current}, not below {new_epoch}"
                )
            rows = first_rows if i == 0 and first_rows is not None else None
            if rows is None:
                rows = pa.Table.from_batches([], schema=pa.schema(table.schema().to_arrow()))
            # The markers of the epochs since the last bump, at FENCED: a delta-spark
            # append of one of them is skipped or conflicts (module docstring).
            fenced = [
                Transaction(batch_txn_id(application_id, older), FENCED)
                for older in range(max(current, 0), new_epoch)
            ]
            props = CommitProperties(
                app_transactions=[Transaction(fence_txn_id(application_id), new_epoch), *fenced],
                custom_metadata={
                    "application_id": application_id,
                    "platform_operation": "epoch_bump",
                    "epoch": str(new_epoch),
                    "reason": reason,
                },
            )
            try:
                write_deltalake(table, rows, mode="append", commit_properties=props)
            except CommitFailedError:
                continue  # another commit won the version: look again
            break
        else:
            raise ConsistencyError(f"could not bump the epoch of {path}: too many conflicts")


def fenced_properties(
    application_id: str, epoch: int, operation: str, tags: dict[str, str] | None = None
) -> CommitProperties:
    """Commit properties of an operation's own commits in its (new) epoch, tagged
    with the operation (and its reason and versions) in the commit info."""
    return CommitProperties(
        app_transactions=[Transaction(fence_txn_id(application_id), epoch)],
        custom_metadata={
            "application_id": application_id,
            "platform_operation": operation,
            "epoch": str(epoch),
            **(tags or {}),
        },
    )


def find_stamped_commit(path: Path, stamp: str, after: int) -> int | None:
    """The version after ``after`` whose commit carries ``stamp`` as its user
    metadata (a delta-spark append of ``append_frame``), or None. Read entry by
    entry: delta-rs's history labels versions from its snapshot, which a commit
    landing during the read can shift by one."""
    version = after + 1
    while (actions := commit_actions(path, version)) is not None:
        for action in actions:
            if action.get("commitInfo", {}).get("userMetadata") == stamp:
                return version
        version += 1
    return None
