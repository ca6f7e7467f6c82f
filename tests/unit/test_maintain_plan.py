"""The vacuum rule of ``maintain``: which boundary stays the oldest rewind target,
and what keeps its state version (and every later one) loadable; and its
refusals, made when it plans and again when it applies (no Spark)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from hypothesis import given
from hypothesis import strategies as st

from jobs import resolution
from jobs.delta import layout as tables
from jobs.delta.files import stale_staged_files
from jobs.delta.layout import AppLayout, ensure_tables
from jobs.delta.writer import bump_epoch
from jobs.errors import ConsistencyError, LockedError
from jobs.ledger import Boundary
from jobs.lock import application_lock
from jobs.operations.maintain import (
    HOUR_US,
    PLAN_MARGIN_US,
    Grace,
    MaintenancePlan,
    apply_maintenance,
    oldest_kept,
    plan_maintenance,
    vacuum_retention_hours,
    vacuum_rule,
)
from jobs.pipeline.parser import load_pipeline
from jobs.settings import REPO_ROOT, Settings, load_settings
from tests import ledger_rows as ledger

NOW = 1_000 * HOUR_US
MS = 1000


def boundary(batch: int, version: int, hours_ago: float) -> Boundary:
    return Boundary(0, batch, {("t", 0): batch}, version, 0, NOW - int(hours_ago * HOUR_US))


BOUNDARIES = [boundary(0, 1, 50), boundary(1, 3, 30), boundary(2, 4, 20), boundary(3, 6, 0.5)]
# Each state version's earliest writer stamp (milliseconds): version v+1 removes
# what version v's batch replaced, a moment after v's boundary.
STAMPS = {2: 49, 3: 30, 4: 20, 5: 19.9, 6: 0.5, 7: 0.4}


def stamps(skew_hours: float = 0.0) -> dict[int, int]:
    return {v: (NOW - int((ago + skew_hours) * HOUR_US)) // MS for v, ago in STAMPS.items()}


def test_the_last_boundary_before_the_horizon_is_kept() -> None:
    # a horizon of 24 h: the boundary 30 h ago is where a 24 h rewind lands
    assert oldest_kept(BOUNDARIES, NOW - 24 * HOUR_US) == BOUNDARIES[1]
    assert oldest_kept(BOUNDARIES, NOW - 100 * HOUR_US) == BOUNDARIES[0]  # none before: oldest
    assert oldest_kept([], NOW) is None


def test_retention_covers_the_first_removal_after_the_kept_boundary_in_whole_hours() -> None:
    retention, keep = vacuum_rule(BOUNDARIES, BOUNDARIES[2], stamps(), NOW, grace_us=HOUR_US)
    assert retention == 19  # version 5 removed version 4's files 19.9 h ago
    assert keep == (4,)  # the 0.9 h before: kept by version


def test_a_short_horizon_keeps_versions_by_name() -> None:
    retention, keep = vacuum_rule(BOUNDARIES, BOUNDARIES[3], stamps(), NOW, grace_us=0)
    assert retention == 0
    assert keep == (6,)  # version 7 removed its files 0.4 h ago


def test_a_boundary_nothing_removed_files_of_yet_is_kept_by_name() -> None:
    """Found by review: the newest boundary is kept, and nothing has removed its
    files when maintain plans; its own compaction then does, stamped after the
    plan, and a vacuum with no retention would delete them."""
    untouched = {v: t for v, t in stamps().items() if v <= 6}
    retention, keep = vacuum_rule(BOUNDARIES, BOUNDARIES[3], untouched, NOW, grace_us=0)
    assert retention == 0
    assert keep == (6,)


def test_grace_is_a_floor_and_nothing_committed_keeps_only_grace() -> None:
    assert vacuum_rule(BOUNDARIES, BOUNDARIES[3], stamps(), NOW, 48 * HOUR_US) == (48, ())
    assert vacuum_rule([], None, {}, NOW, grace_us=2 * HOUR_US - 1) == (2, ())


@pytest.mark.parametrize("skew_hours", [-30.0, -3.0, 0.0, 2.5, 40.0])
def test_a_writer_clock_off_by_hours_loses_no_kept_version(skew_hours: float) -> None:
    """Delta's vacuum compares writers' stamps with its own clock: the retention is
    computed in that frame, so a writer ahead or behind by hours changes the
    hours, never what stays. Checked against Delta's rule, replayed in plain
    Python: a file version v referenced and version w > v removed goes when w's
    stamp is older than the vacuum's clock less the retention, unless v is kept
    by name; the vacuum runs up to the plan's margin later."""
    skewed = stamps(skew_hours)
    for kept in BOUNDARIES:
        retention, keep = vacuum_rule(BOUNDARIES, kept, skewed, NOW, grace_us=0)
        for later in (0, PLAN_MARGIN_US - 1):
            cutoff = NOW + later - retention * HOUR_US
            for b in BOUNDARIES:
                if b.state_version < kept.state_version:
                    continue
                gone = any(w > b.state_version and t * MS < cutoff for w, t in skewed.items())
                assert not gone or b.state_version in keep, (kept, b, retention, keep)


@given(
    planned=st.integers(0, 10**9),
    retention=st.integers(0, 24 * 365),
    output=st.integers(0, 24 * 365),
    elapsed=st.integers(0, 30 * 24 * HOUR_US),
)
def test_the_vacuum_cutoff_is_never_later_than_the_plans_however_late_it_runs(
    planned: int, retention: int, output: int, elapsed: int
) -> None:
    """A compaction of hours (or a pause) between the plan and the vacuum: the
    vacuum's cutoff, its clock less the retention it is given, stays within half
    the plan's margin of the one the plan judged (the margin's other half is for
    the moment before the vacuum reads its clock)."""
    plan = MaintenancePlan(
        "app", 1, "r", 0, 3600, None, retention, (), {}, 0,
        output_retention_hours=output, planned_local_us=planned,
    )  # fmt: skip
    for is_state in (True, False):
        planned_retention = max(retention, output) if is_state else retention
        cutoff = (
            planned + elapsed - vacuum_retention_hours(plan, is_state, planned + elapsed) * HOUR_US
        )
        assert cutoff <= planned - planned_retention * HOUR_US + PLAN_MARGIN_US // 2
        # and it keeps at most an hour more than it must
        assert cutoff > planned - (planned_retention + 1) * HOUR_US


def test_the_first_entry_inside_the_grace_is_judged_on_the_stores_clock() -> None:
    received = {0: NOW - 5 * HOUR_US, 1: NOW - 2 * HOUR_US, 2: NOW - HOUR_US // 2}
    assert Grace(1, NOW, NOW + 7 * HOUR_US).first_received(received) == 1  # before version 2
    assert Grace(3, NOW, NOW).first_received(received) == 0
    assert Grace(0, NOW, NOW).first_received(received) == 2  # none inside: the newest


def test_staged_files_go_once_their_batch_can_no_longer_commit(tmp_path) -> None:  # type: ignore[no-untyped-def]
    layout = AppLayout(tmp_path, "app")
    staged = Path(layout.table("changelog") / "_staging")
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


# What ``maintain`` refuses, it refuses when it applies too: a scheduled stream (or
# an operation) may start, or an operation die after its fence, between plan and apply.
PIPELINE = load_pipeline("user_clicks", REPO_ROOT / "include" / "pipelines")
NO_GRACE = dataclasses.replace(PIPELINE, reader_grace_hours=0)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    layout = AppLayout(tmp_path, NO_GRACE.application_id)
    ensure_tables(layout, resolution.of(NO_GRACE))
    ledger.append(layout, [ledger.batch_row(0, 0, 0, 100, 0)])
    return dataclasses.replace(load_settings(), warehouse=tmp_path)


def being_written(layout: AppLayout) -> Path:
    """A data file a batch has moved into ``state`` and not committed yet: a vacuum
    with no grace deletes it."""
    path = layout.table("state") / "part-e0-b1-c00000-ff.parquet"
    pq.write_table(pa.table({"x": [1]}), path)
    return path


@contextmanager
def a_stream_runs(layout: AppLayout) -> Iterator[None]:
    with application_lock(layout, "run --trigger available-now"):
        yield


@contextmanager
def an_operation_runs(layout: AppLayout) -> Iterator[None]:
    with application_lock(layout, "rewind --reason 'bad deploy'"):
        yield


@contextmanager
def an_operation_died(layout: AppLayout) -> Iterator[None]:
    bump_epoch([layout.table(tables.LEDGER)], layout.application_id, 1, "rewind")
    started = {"phase": "started", "who": "ops", "reason": "bad deploy"}
    ledger.append(layout, [{"entry_type": "rewind", "epoch": 1, "details": json.dumps(started)}])
    yield


REFUSALS = [
    (a_stream_runs, LockedError, "reader_grace_hours is 0, and a stream is running"),
    (an_operation_runs, LockedError, "not next to an operation"),
    (an_operation_died, ConsistencyError, "rewind by ops .* did not finish"),
]


@pytest.mark.parametrize(("situation", "error", "message"), REFUSALS)
def test_maintain_refuses_the_same_when_planning_and_when_applying(
    settings: Settings,
    situation: Callable[[AppLayout], AbstractContextManager[None]],
    error: type[Exception],
    message: str,
) -> None:
    layout = AppLayout(settings.warehouse, NO_GRACE.application_id)
    plan = plan_maintenance(NO_GRACE, settings, "hourly")  # nothing in the way yet
    written = being_written(layout)
    with situation(layout):
        with pytest.raises(error, match=message):
            plan_maintenance(NO_GRACE, settings, "hourly")
        with pytest.raises(error, match=message):
            apply_maintenance(NO_GRACE, settings, plan, echo=lambda _line: None)
    assert written.exists()  # nothing was vacuumed


def test_with_nothing_in_the_way_the_plan_is_applied(settings: Settings) -> None:
    layout = AppLayout(settings.warehouse, NO_GRACE.application_id)
    plan = plan_maintenance(NO_GRACE, settings, "hourly")
    written = being_written(layout)
    apply_maintenance(NO_GRACE, settings, plan, echo=lambda _line: None)
    assert not written.exists()  # what the refusals above protect


def test_a_floor_whose_state_is_gone_does_not_stop_maintenance(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recreated topic's repair state that an older maintain already removed:
    the recomputations that need it refuse; maintain itself goes on (found by
    review: the scheduled maintenance would have failed for good)."""
    from jobs.operations import maintain

    def gone(*_args: object) -> None:
        raise ConsistencyError("the state that holds the judgments ... can no longer be loaded")

    monkeypatch.setattr(maintain, "log_floor", gone)
    plan = plan_maintenance(NO_GRACE, settings, "hourly")
    assert plan.floor_version is None


def test_the_horizon_is_judged_on_the_stores_clock_not_the_batch_writers(tmp_path: Path) -> None:
    """Found by review: the horizon compared the ledger's ``commit_time`` (the batch
    driver's clock) with maintain's own. A driver 2 h behind made a boundary of
    30 min ago look 2.5 h old, so a 1 h horizon kept only the newest one. The
    store's times of the state log entries (a file's time on a local disk) say
    when each version was committed."""
    import os
    import time

    pipeline = dataclasses.replace(NO_GRACE, rewind_horizon_seconds=3600)
    layout = AppLayout(tmp_path, pipeline.application_id)
    ensure_tables(layout, resolution.of(pipeline))
    state = DeltaTable(str(layout.table("state")))
    now = time.time()
    committed_ago_s = {1: 3 * 3600, 2: 2 * 3600, 3: 1800, 4: 600}
    rows = []
    for version, ago in committed_ago_s.items():
        state.alter.set_table_properties({"delta.checkpointInterval": str(10 + version)})
        entry = layout.table("state") / "_delta_log" / f"{version:020d}.json"
        os.utime(entry, (now - ago, now - ago))
        behind = int((now - ago - 2 * 3600) * 1_000_000)  # the driver's clock: 2 h behind
        batch = version - 1
        rows.append(
            ledger.batch_row(0, batch, batch * 100, version * 100, version, commit_time=behind)
        )
    ledger.append(layout, rows)
    settings = dataclasses.replace(load_settings(), warehouse=tmp_path)
    plan = plan_maintenance(pipeline, settings, "hourly")
    assert plan.kept is not None
    assert plan.kept.state_version == 2  # the last boundary an hour or more ago
