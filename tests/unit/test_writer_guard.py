"""A writer whose hold on the application was lost commits nothing: the guard runs
before every commit attempt (``jobs/lease.py`` on object storage)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from jobs.delta.layout import AppLayout
from jobs.delta.writer import (
    _HOLD_CHECK,
    BatchWriter,
    OperationFence,
    bump_epoch,
    commits_checked_by,
)
from jobs.lease import LeaseLostError
from jobs.lock import application_lock
from jobs.warehouse import Location


def test_a_lost_hold_stops_the_commit_before_it_is_written(tmp_path: Path) -> None:
    table = Location.local_path(tmp_path / "t")
    write_deltalake(str(table), pa.table({"n": [0]}))

    writer = BatchWriter("app", 0, guard=lost)
    with pytest.raises(LeaseLostError, match="taken over"):
        writer.append(table, 0, pa.table({"n": [1]}))
    assert DeltaTable(str(table)).version() == 0
    assert BatchWriter("app", 0, guard=lambda: None).append(table, 0, pa.table({"n": [1]})) == 1


def lost() -> None:
    raise LeaseLostError("the lease on app was taken over")


def test_an_operations_commits_check_the_hold_of_its_thread(tmp_path: Path) -> None:
    """An operation commits on its own thread: the hold ``jobs/lock.py`` installs
    is checked before an epoch bump, a fenced commit's properties, an audit row and
    a writer without a guard of its own; outside the block nothing is checked."""
    table = Location.local_path(tmp_path / "t")
    write_deltalake(str(table), pa.table({"n": [0]}))
    with commits_checked_by(lost):
        with pytest.raises(LeaseLostError):
            bump_epoch([table], "app", 1, "test")
        with pytest.raises(LeaseLostError):
            OperationFence("app", 1, "rewind").on(DeltaTable(str(table)))
        with pytest.raises(LeaseLostError):
            BatchWriter("app", 0).append(table, 0, pa.table({"n": [1]}))
    assert DeltaTable(str(table)).version() == 0
    OperationFence("app", 1, "rewind").on(DeltaTable(str(table)))
    bump_epoch([table], "app", 1, "test")
    assert DeltaTable(str(table)).version() == 1


def test_the_application_lock_installs_its_holds_check(tmp_path: Path) -> None:
    layout = AppLayout(Location.local_path(tmp_path / "warehouse"), "app")
    seen: list[object] = []
    with application_lock(layout, "test"):
        seen.append(_HOLD_CHECK.get())
    assert seen[0] is not None
    assert _HOLD_CHECK.get() is None
