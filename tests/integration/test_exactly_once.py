"""Idempotent, fenced Delta commits: replays, concurrent writers, zombie writers."""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from jobs.delta.writer import BatchWriter, bump_epoch, committed_batch, table_epoch
from jobs.errors import FencedError

SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64())])
APP = "app"


def rows(*pairs: tuple[str, int]) -> pa.Table:
    return pa.Table.from_pylist([{"k": k, "v": v} for k, v in pairs], SCHEMA)


@pytest.fixture
def table(tmp_path: Path) -> Path:
    path = tmp_path / "t"
    DeltaTable.create(str(path), SCHEMA)
    return path


def read(path: Path) -> list[tuple[str, int]]:
    data = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    return sorted((r["k"], r["v"]) for r in data)


def test_a_replayed_batch_is_skipped(table: Path) -> None:
    writer = BatchWriter(APP, epoch=0)
    assert writer.append(table, 0, rows(("a", 1))) is not None
    assert writer.append(table, 0, rows(("a", 1))) is None
    assert writer.append(table, 1, rows(("b", 2))) is not None
    assert writer.append(table, 1, rows(("b", 2))) is None
    assert read(table) == [("a", 1), ("b", 2)]
    assert committed_batch(DeltaTable(str(table)), APP, 0) == 1


def test_a_new_epoch_has_its_own_batch_ids(table: Path) -> None:
    BatchWriter(APP, epoch=0).append(table, 0, rows(("a", 1)))
    bump_epoch([table], APP, 1, "test")
    # Batch 0 of epoch 1 is a different batch from batch 0 of epoch 0.
    assert BatchWriter(APP, epoch=1).append(table, 0, rows(("b", 1))) is not None
    assert read(table) == [("a", 1), ("b", 1)]


def test_two_writers_of_the_same_batch_cannot_both_commit(table: Path) -> None:
    """Both check before either commits (forced by a barrier): exactly one row lands."""
    barrier = threading.Barrier(2, timeout=30)
    results: dict[str, object] = {}

    def write(name: str) -> None:
        writer = BatchWriter(APP, epoch=0, before_commit=lambda _t: barrier.wait())
        try:
            results[name] = writer.append(table, 7, rows((name, 1)))
        except Exception as exc:  # pragma: no cover - reported below
            results[name] = exc

    threads = [threading.Thread(target=write, args=(n,)) for n in ("w1", "w2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    data = read(table)
    assert len(data) == 1, data
    # The loser saw the conflict, looked again and found the batch there: skipped.
    assert sorted(v is None for v in results.values()) == [False, True], results


def test_concurrent_merges_of_the_same_batch_apply_once(table: Path) -> None:
    BatchWriter(APP, epoch=0).append(table, 0, rows(("a", 10)))
    barrier = threading.Barrier(2, timeout=30)
    results: list[object] = []

    def merge() -> None:
        writer = BatchWriter(APP, epoch=0, before_commit=lambda _t: barrier.wait())
        results.append(writer.merge(table, 1, rows(("a", 11), ("b", 1)), ("k",)))

    threads = [threading.Thread(target=merge) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert read(table) == [("a", 11), ("b", 1)]
    assert sum(r is None for r in results) == 1


def test_a_writer_of_an_old_epoch_is_fenced(table: Path) -> None:
    old = BatchWriter(APP, epoch=0)
    old.append(table, 0, rows(("a", 1)))
    bump_epoch([table], APP, 1, "maintenance")
    with pytest.raises(FencedError, match="moved to epoch 1"):
        old.append(table, 1, rows(("zombie", 1)))
    assert read(table) == [("a", 1)]


def test_fencing_is_atomic_with_the_commit(table: Path) -> None:
    """The bump lands between the zombie's fence check and its commit: the zombie's
    commit conflicts, it looks again, sees the new epoch and refuses."""
    bumped = []

    def bump_now(_table: str) -> None:
        if not bumped:
            bump_epoch([table], APP, 1, "maintenance")
            bumped.append(True)

    zombie = BatchWriter(APP, epoch=0, before_commit=bump_now)
    with pytest.raises(FencedError):
        zombie.append(table, 0, rows(("zombie", 1)))
    assert read(table) == []
    assert table_epoch(DeltaTable(str(table)), APP) == 1


def test_epoch_cannot_go_backwards(table: Path) -> None:
    bump_epoch([table], APP, 2, "x")
    with pytest.raises(FencedError, match=r"moved to epoch 2 .* before this bump to epoch 2"):
        bump_epoch([table], APP, 2, "again")


def test_at_least_once_does_not_check(table: Path) -> None:
    writer = BatchWriter(APP, epoch=0, exactly_once=False)
    writer.append(table, 0, rows(("a", 1)))
    writer.append(table, 0, rows(("a", 1)))
    assert read(table) == [("a", 1), ("a", 1)]
    # ... but it is still fenced.
    bump_epoch([table], APP, 1, "x")
    with pytest.raises(FencedError):
        writer.append(table, 1, rows(("b", 1)))
