"""A writer whose hold on the application was lost commits nothing: the guard runs
before every commit attempt (``jobs/lease.py`` on object storage)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from jobs.delta.writer import BatchWriter
from jobs.lease import LeaseLostError
from jobs.warehouse import Location


def test_a_lost_hold_stops_the_commit_before_it_is_written(tmp_path: Path) -> None:
    table = Location.local_path(tmp_path / "t")
    write_deltalake(str(table), pa.table({"n": [0]}))

    def lost() -> None:
        raise LeaseLostError("the lease on app was taken over")

    writer = BatchWriter("app", 0, guard=lost)
    with pytest.raises(LeaseLostError, match="taken over"):
        writer.append(table, 0, pa.table({"n": [1]}))
    assert DeltaTable(str(table)).version() == 0
    assert BatchWriter("app", 0, guard=lambda: None).append(table, 0, pa.table({"n": [1]})) == 1
