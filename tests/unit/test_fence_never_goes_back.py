"""An operation's commits are checked against the fence in the snapshot they are made
on: a paused operation that wakes after a newer holder's bump commits nothing, and
the ``<app>/fence`` transaction never decreases (a commit carrying an older epoch's
fence would set it back, and let the zombie's next writes through). Real delta-rs
tables; the bump lands both before the zombie reads (it must look) and between its
read and its commit (the commit itself must conflict)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from jobs.cut import StateAction, StateChange, _change_state, remove_orphans
from jobs.delta.layout import AppLayout
from jobs.delta.writer import OperationFence, bump_epoch, table_epoch
from jobs.errors import FencedError
from jobs.warehouse import Location

APP = "app"
ROWS = pa.table({"k": ["a", "b"], "n": [1, 2], "epoch": [1, 1], "batch_id": [0, 0]})


def a_table(tmp_path: Path) -> Location:
    path = Location.local_path(tmp_path / "warehouse" / APP / "changelog")
    write_deltalake(str(path), ROWS)
    bump_epoch([path], APP, 1, "first epoch")
    write_deltalake(str(path), ROWS.slice(0, 1), mode="append")
    return path


def restore(path: Location, fence: OperationFence) -> None:
    _change_state(path, StateChange(StateAction.RESTORE, 0), fence)


def empty(path: Location, fence: OperationFence) -> None:
    _change_state(path, StateChange(StateAction.EMPTY), fence)


def orphans(path: Location, fence: OperationFence) -> None:
    layout = AppLayout(Location.local_path(Path(path.uri).parents[1]), APP)
    remove_orphans(layout, [path], fence.epoch + 1, fence)


def append(path: Location, fence: OperationFence) -> None:
    table = DeltaTable(str(path))
    write_deltalake(table, ROWS, mode="append", commit_properties=fence.on(table))


WRITES: dict[str, Callable[[Location, OperationFence], None]] = {
    "restore": restore,
    "empty": empty,
    "remove_orphans": orphans,
    "append": append,
}


@pytest.mark.parametrize("write", sorted(WRITES))
def test_a_zombie_that_wakes_after_the_bump_commits_nothing(tmp_path: Path, write: str) -> None:
    path = a_table(tmp_path)
    zombie = OperationFence(APP, 1, "rewind")
    bump_epoch([path], APP, 2, "a newer holder's operation")
    before = DeltaTable(str(path)).version()
    with pytest.raises(FencedError, match="moved to epoch 2"):
        WRITES[write](path, zombie)
    table = DeltaTable(str(path))
    assert table.version() == before
    assert table_epoch(table, APP) == 2


@pytest.mark.parametrize("write", sorted(WRITES))
def test_a_bump_between_the_zombies_read_and_its_commit_fails_the_commit(
    tmp_path: Path, write: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = a_table(tmp_path)
    zombie = OperationFence(APP, 1, "rewind")
    checked = OperationFence.on

    def paused_after_the_check(self: OperationFence, table: DeltaTable):  # type: ignore[no-untyped-def]
        props = checked(self, table)
        bump_epoch([path], APP, 2, "taken over while the zombie was paused")
        return props

    monkeypatch.setattr(OperationFence, "on", paused_after_the_check)
    with pytest.raises(Exception):  # noqa: B017 - delta-rs' commit conflict, whatever its type
        WRITES[write](path, zombie)
    assert table_epoch(DeltaTable(str(path)), APP) == 2


def test_the_operations_own_epoch_commits(tmp_path: Path) -> None:
    path = a_table(tmp_path)
    bump_epoch([path], APP, 2, "this operation")
    restore(path, OperationFence(APP, 2, "rewind"))
    table = DeltaTable(str(path))
    assert table_epoch(table, APP) == 2
    assert table.to_pyarrow_table().num_rows == ROWS.num_rows


def test_a_zombie_bump_of_an_older_epoch_is_refused(tmp_path: Path) -> None:
    path = a_table(tmp_path)
    bump_epoch([path], APP, 3, "newer")
    with pytest.raises(FencedError):
        bump_epoch([path], APP, 2, "a zombie's bump")
    assert table_epoch(DeltaTable(str(path)), APP) == 3


def test_a_bump_whose_answer_was_lost_is_the_operations_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bump's commit was applied and its answer lost; the retry, on the snapshot
    it read, conflicts: the operation finds its own bump, not another holder's (it
    was refused as fenced by itself)."""
    from jobs.delta import writer

    path = a_table(tmp_path)
    real = writer.write_deltalake

    def reply_lost_then_retried(table: Any, *args: Any, **kwargs: Any) -> None:
        read = table.version()
        real(table, *args, **kwargs)
        real(DeltaTable(table.table_uri, version=read), *args, **kwargs)

    monkeypatch.setattr(writer, "write_deltalake", reply_lost_then_retried)
    bump_epoch([path], APP, 2, "this operation")
    monkeypatch.undo()
    assert table_epoch(DeltaTable(str(path)), APP) == 2
    with pytest.raises(FencedError):  # another holder's bump stays refused
        bump_epoch([path], APP, 2, "a second taker of epoch 2")


def test_maintenance_planned_before_an_operations_bump_commits_nothing(tmp_path: Path) -> None:
    """``maintain`` takes no lease (it runs beside a live stream): its compaction,
    vacuum and settings commits carry the fence of the epoch it planned in, checked
    in their own snapshot, so a maintain that planned before an operation's bump
    commits nothing after it."""
    from jobs.operations.maintain import MaintenancePlan, maintain_table

    path = a_table(tmp_path)
    plan = MaintenancePlan(APP, 1, "hourly", 0, 3600, None, 168, (), {}, 0)
    bump_epoch([path], APP, 2, "an operation, while maintain was paused")
    before = DeltaTable(str(path)).version()
    with pytest.raises(FencedError, match="moved to epoch 2"):
        maintain_table(path, plan, False)
    assert DeltaTable(str(path)).version() == before
    assert table_epoch(DeltaTable(str(path)), APP) == 2
    maintain_table(path, dataclasses_replace(plan, epoch=2), False)  # its own epoch: done
    assert table_epoch(DeltaTable(str(path)), APP) == 2


def dataclasses_replace(plan: Any, **changes: Any) -> Any:
    import dataclasses

    return dataclasses.replace(plan, **changes)


def test_maintenance_beside_a_running_stream_does_not_conflict_with_its_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch commits between maintain's read and its commit, at every attempt (a
    stream committing every few seconds, a compaction taking longer): maintain's
    fence must not conflict with the batches' (only with a bump), or it never
    commits, and the stream's batches lose to it in turn."""
    from jobs.delta.writer import BatchWriter
    from jobs.operations.maintain import MaintenancePlan, maintain_table

    path = a_table(tmp_path)
    bump_epoch([path], APP, 2, "the stream's epoch")
    stream = BatchWriter(APP, 2)
    batches = iter(range(100))
    checked = OperationFence.on

    def a_batch_commits_meanwhile(self: OperationFence, table: DeltaTable):  # type: ignore[no-untyped-def]
        props = checked(self, table)
        stream.append(path, next(batches), ROWS)
        return props

    monkeypatch.setattr(OperationFence, "on", a_batch_commits_meanwhile)
    plan = MaintenancePlan(APP, 2, "hourly", 0, 3600, None, 168, (), {}, 0)
    maintain_table(path, plan, False)
    assert next(batches) <= 6  # one batch per maintain commit, none retried
