"""The state merge's window range (``window_range``): delta-rs reads only the files
a batch's windows can touch, and no row that matches is left outside the range
(it would be inserted a second time). Plain delta-rs, no Spark."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from jobs.delta.writer import BatchWriter, window_range

TS = pa.timestamp("us", tz="UTC")
KEYS = ("user_id", "window_start", "window_end")
MINUTE = 60_000_000
BASE = 1_795_000_000_123_457  # a time with microseconds in it


def windows(rows: list[tuple[str, int, int]]) -> pa.Table:
    return pa.table(
        {
            "user_id": pa.array([r[0] for r in rows], pa.string()),
            "window_start": pa.array([r[1] for r in rows], TS),
            "window_end": pa.array([r[1] + MINUTE for r in rows], TS),
            "clicks": pa.array([r[2] for r in rows], pa.int64()),
        }
    )


def contents(path: Path) -> list[tuple[str, int, int]]:
    table = DeltaTable(str(path)).to_pyarrow_table()
    starts = table["window_start"].cast(pa.int64()).to_pylist()
    users, clicks = table["user_id"].to_pylist(), table["clicks"].to_pylist()
    return sorted(zip(users, starts, clicks, strict=True))


def test_rows_on_the_range_edges_are_updated_not_duplicated(tmp_path: Path) -> None:
    path = tmp_path / "state"
    # Old windows in one file, the newest in another (as a stream's appends leave them).
    old = [(f"u{i}", BASE + i * MINUTE, 1) for i in range(50)]
    new = [(f"u{i}", BASE + (100 + i) * MINUTE + 1, 1) for i in range(10)]
    write_deltalake(str(path), windows(old))
    write_deltalake(str(path), windows(new), mode="append")
    # The batch: the newest window's edges exactly (a microsecond off would miss),
    # an old window, and a key that is new.
    source_rows = [new[0][:2] + (5,), new[-1][:2] + (6,), old[3][:2] + (7,)]
    source_rows.append(("u999", BASE + 200 * MINUTE, 8))
    source = windows(source_rows)
    within = window_range("window_start", source["window_start"])
    assert within is not None

    BatchWriter("app", 0).merge(path, 0, source, KEYS, within=within)

    expected = {r[:2]: r[2] for r in old + new}
    expected.update({r[:2]: r[2] for r in source_rows})
    assert contents(path) == sorted((k[0], k[1], v) for k, v in expected.items())


def test_a_range_leaves_the_rows_outside_it_alone(tmp_path: Path) -> None:
    path = tmp_path / "state"
    rows = [(f"u{i}", BASE + i * MINUTE, 1) for i in range(20)]
    write_deltalake(str(path), windows(rows))
    # The same keys just outside the source's range are not touched by the range
    # itself: a merge restricted to [5, 7] updates exactly those windows.
    source_rows = [(f"u{i}", BASE + i * MINUTE, 9) for i in (5, 6, 7)]
    source = windows(source_rows)
    within = window_range("window_start", source["window_start"])
    BatchWriter("app", 0).merge(path, 0, source, KEYS, within=within)
    expected = {r[:2]: r[2] for r in rows}
    expected.update({r[:2]: r[2] for r in source_rows})
    assert contents(path) == sorted((k[0], k[1], v) for k, v in expected.items())


def test_no_windows_no_range() -> None:
    assert window_range("window_start", pa.array([], TS)) is None
