"""A dimension load's fencing token against the one its table recorded, without
Spark: a lease object deleted by hand (or lost) starts again at generation 1, and
a load carrying it would be skipped by Delta for ever (reported as a newer load).
The holder advances its lease past the table's token first; a stale holder cannot.
The table is a local Delta table written by delta-rs, the lease an in-memory store
with S3's conditional writes (``tests/unit/test_lease_records.py``)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import CommitProperties, Transaction, write_deltalake

from jobs import lease
from jobs.dimension_load import Dimension, fence_ahead_of_table, recorded_generation, txn_app_id
from jobs.errors import LeaseLostError
from jobs.lock import _Flocked
from jobs.warehouse import Location
from tests.unit.test_lease_records import FakeLocation, FakeStore, _record

DIMENSION = Dimension(
    "merchants", "", "${warehouse}/incoming/merchants.jsonl", "id", {"id": "string"}, None
)


def loaded_with(warehouse: Location, generation: int) -> Location:
    """The table as a load with ``generation`` left it (what delta-spark's
    txnAppId/txnVersion record)."""
    table = DIMENSION.table(warehouse)
    write_deltalake(
        str(table),
        pa.table({"id": ["m1"]}),
        mode="overwrite",
        commit_properties=CommitProperties(
            app_transactions=[Transaction(txn_app_id(DIMENSION), generation)]
        ),
    )
    return table


def taken(where: FakeLocation) -> lease.Lease:
    return lease.take(where, "dimension --dimension merchants", "me", lease.MIN_TTL_S)  # type: ignore[arg-type]


@pytest.fixture
def where() -> FakeLocation:
    return FakeLocation(FakeStore(), "dims/_merchants.lease")


def test_the_generation_a_table_recorded_is_read_with_delta_rs(tmp_path: Path) -> None:
    warehouse = Location.local_path(tmp_path)
    assert recorded_generation(DIMENSION, DIMENSION.table(warehouse)) is None  # no table yet
    assert recorded_generation(DIMENSION, loaded_with(warehouse, 5)) == 5


def test_a_lease_begun_again_below_the_table_is_advanced_past_it(
    tmp_path: Path, where: FakeLocation
) -> None:
    table = loaded_with(Location.local_path(tmp_path), 5)  # the lease object since deleted
    held = taken(where)
    try:
        assert held.generation == 1
        fence_ahead_of_table(held, DIMENSION, table)
        assert held.generation == 6  # what the load's commit carries now
        assert json.loads(where.read_bytes())["generation"] == 6
        held.check()
    finally:
        held.release()
    again = taken(where)  # the next loader goes on from the advanced lease
    try:
        assert again.generation == 7
        before = where.stat()
        fence_ahead_of_table(again, DIMENSION, loaded_with(Location.local_path(tmp_path), 6))
        assert again.generation == 7 and where.stat() == before  # ahead: nothing written
    finally:
        again.release()


def test_a_stale_holder_is_refused_as_before_a_newer_load(
    tmp_path: Path, where: FakeLocation
) -> None:
    """Another loader took the lease over (generation 2) and loaded: the paused one
    (generation 1) may not advance past it, and writes nothing."""
    held = taken(where)
    where.put_raw(_record(generation=2, renewed_s=time.time(), ttl_s=30))  # the taker's
    table = loaded_with(Location.local_path(tmp_path), 2)
    with pytest.raises(LeaseLostError, match=r"^dimension merchants: a newer load of .* committed"):
        fence_ahead_of_table(held, DIMENSION, table)
    assert held.generation == 1
    assert json.loads(where.read_bytes())["generation"] == 2
    assert json.loads(where.read_bytes())["holder"] == "other"
    held.release()


def test_a_flock_carries_no_token_and_reads_no_table(tmp_path: Path) -> None:
    held = _Flocked()
    fence_ahead_of_table(held, DIMENSION, Location.local_path(tmp_path / "no" / "table"))
    assert held.generation is None
