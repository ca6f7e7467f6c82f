"""The vacuum rule of ``maintain``: which boundary stays the oldest rewind target,
and what keeps its state version (and every later one) loadable."""

from __future__ import annotations

from jobs.delta.files import stale_staged_files
from jobs.delta.layout import AppLayout
from jobs.ledger import Boundary
from jobs.operations.maintain import (
    HOUR_US,
    PLAN_MARGIN_US,
    oldest_kept,
    vacuum_rule,
)

NOW = 1_000 * HOUR_US


def boundary(batch: int, version: int, hours_ago: float) -> Boundary:
    return Boundary(0, batch, {("t", 0): batch}, version, 0, NOW - int(hours_ago * HOUR_US))


BOUNDARIES = [boundary(0, 1, 50), boundary(1, 3, 30), boundary(2, 4, 20), boundary(3, 6, 0.5)]


def test_the_last_boundary_before_the_horizon_is_kept() -> None:
    # a horizon of 24 h: the boundary 30 h ago is where a 24 h rewind lands
    assert oldest_kept(BOUNDARIES, NOW - 24 * HOUR_US) == BOUNDARIES[1]
    assert oldest_kept(BOUNDARIES, NOW - 100 * HOUR_US) == BOUNDARIES[0]  # none before: oldest
    assert oldest_kept([], NOW) is None


def test_retention_covers_the_kept_boundary_in_whole_hours() -> None:
    retention, keep = vacuum_rule(BOUNDARIES, BOUNDARIES[2], NOW, grace_hours=1)
    assert retention == 20  # files removed in the last 20 h stay
    assert keep == (4,)  # the 0-20 min before the cutoff: kept by version


def test_a_short_horizon_keeps_versions_by_name() -> None:
    retention, keep = vacuum_rule(BOUNDARIES, BOUNDARIES[3], NOW, grace_hours=0)
    assert retention == 0
    assert keep == (6,)
    # A boundary committed inside the plan margin is kept by name too.
    late = boundary(4, 7, -PLAN_MARGIN_US / HOUR_US / 2)
    assert vacuum_rule([*BOUNDARIES, late], BOUNDARIES[3], NOW, 0)[1] == (6, 7)


def test_grace_is_a_floor_and_nothing_committed_keeps_only_grace() -> None:
    assert vacuum_rule(BOUNDARIES, BOUNDARIES[3], NOW, grace_hours=48) == (48, ())
    assert vacuum_rule([], None, NOW, grace_hours=2) == (2, ())


def test_staged_files_go_once_their_batch_can_no_longer_commit(tmp_path) -> None:  # type: ignore[no-untyped-def]
    layout = AppLayout(tmp_path, "app")
    staged = layout.table("changelog") / "_staging"
    staged.mkdir(parents=True)
    names = {
        "old_epoch": "part-e1-b9-c00000-aa.parquet",  # fenced: epoch 1 < 2
        "committed": "part-e2-b3-c00001-bb.parquet",  # the ledger has batch 3
        "killed_task": ".part-e2-b3-c00002-cc.parquet.tmp",
        "in_flight": "part-e2-b4-c00000-dd.parquet",  # batch 4 may still commit
        "in_flight_tmp": ".part-e2-b4-c00001-ee.parquet.tmp",
        "foreign": "notes.txt",
    }
    for name in names.values():
        (staged / name).write_bytes(b"x")
    found = {p.name for p in stale_staged_files(layout.table("changelog"), 2, 3)}
    assert found == {names["old_epoch"], names["committed"], names["killed_task"]}
    # Before the epoch's first commit, only older epochs' files are stale.
    assert {p.name for p in stale_staged_files(layout.table("changelog"), 2, None)} == {
        names["old_epoch"]
    }
