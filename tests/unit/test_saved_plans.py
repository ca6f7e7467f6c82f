"""Reviewed plans: saved by a dry run, loaded exactly, refused once the
application moved (real Delta tables; no broker)."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest
from deltalake import CommitProperties, DeltaTable

from jobs import resolution
from jobs.audit import append_audit, audit_row
from jobs.cut import StateAction
from jobs.delta import layout as tables
from jobs.delta.layout import AppLayout
from jobs.errors import ConfigError
from jobs.ledger import MAINTAIN, STARTED, Boundary
from jobs.operations import saved_plans
from jobs.operations.plan import Plan
from tests.output_tables import StateWriter, clicks_pipeline

PLAN = "20261207T101500Z-1a2b3c4d"


def a_plan() -> Plan:
    return Plan(
        operation="rewind",
        application_id="user_clicks",
        reason="replay",
        epoch_before=2,
        epoch_after=3,
        current_offsets={("clicks", 0): 900, ("clicks", 1): 850},
        target_offsets={("clicks", 0): 400, ("clicks", 1): 420},
        seed_state_version=7,
        state_action=StateAction.RESTORE,
        boundary=Boundary(2, 5, {("clicks", 0): 400, ("clicks", 1): 420}, 7, 1234, 99),
        restore_version=7,
        records_to_replay=930,
        skipped={"clicks[0]": [1, 2]},
        notes=["a note"],
    )


def test_a_plan_survives_its_json() -> None:
    plan = a_plan()
    assert Plan.from_dict(plan.to_dict()) == plan


def test_a_backfill_reads_its_ranges_and_nothing_when_they_are_empty() -> None:
    """Found by a random sequence (rebuild --from-source, skip, backfill): a plan
    with nothing judged to read read [read_from, target) as a plan saved before
    ranges were recorded does."""
    plan = dataclasses.replace(
        a_plan(),
        read_from={("clicks", 0): 0},
        target_offsets={("clicks", 0): 11},
        read_ranges={"clicks[0]": [[0, 5], [8, 11]]},
    )
    assert Plan.from_dict(plan.to_dict()).ranges() == {("clicks", 0): [(0, 5), (8, 11)]}
    assert dataclasses.replace(plan, read_ranges={}).ranges() == {}
    old = dataclasses.replace(plan, read_ranges=None)  # saved before ranges were recorded
    assert old.ranges() == {("clicks", 0): [(0, 11)]}


def test_saved_and_loaded_exactly(tmp_path: Path) -> None:
    writer = StateWriter(tmp_path, clicks_pipeline())
    plan_id = saved_plans.save(writer.layout, writer.pipeline, a_plan(), {"preview": {"keys": 3}})
    assert saved_plans.PLAN_ID.match(plan_id)
    loaded = saved_plans.load(writer.layout, plan_id, "rewind")
    assert loaded.plan == dataclasses.replace(a_plan(), plan_id=plan_id)
    assert loaded.extra == {"preview": {"keys": 3}}
    assert loaded.position == saved_plans.position(writer.layout, writer.pipeline.version)
    saved_plans.check_unmoved(writer.layout, writer.pipeline.version, loaded)


def test_a_plan_the_application_moved_away_from_is_refused(tmp_path: Path) -> None:
    writer = StateWriter(tmp_path, clicks_pipeline())
    plan_id = saved_plans.save(writer.layout, writer.pipeline, a_plan())
    writer.batch({"a": 1})  # the state moved (a batch's merge)
    reviewed = saved_plans.load(writer.layout, plan_id, "rewind")
    with pytest.raises(ConfigError) as error:
        saved_plans.check_unmoved(writer.layout, writer.pipeline.version, reviewed)
    message = str(error.value)
    assert "the state table moved from version 0 to 1 (version 1 was a batch)" in message
    assert "make a new plan with --dry-run" in message
    newer = dataclasses.replace(writer.pipeline, version=2)
    with pytest.raises(ConfigError, match="the pipeline version was 1, now 2"):
        saved_plans.check_unmoved(writer.layout, newer.version, reviewed)
    moved = dataclasses.replace(reviewed.position, last_batch=(0, 4))
    assert moved.changes_since(reviewed.position) == [
        "the last committed batch was none, now epoch 0 batch 4"
    ]


def test_maintenance_does_not_move_a_plan_unless_it_removed_what_the_plan_restores(
    tmp_path: Path,
) -> None:
    writer = StateWriter(tmp_path, clicks_pipeline())
    writer.batch({"a": 1})
    writer.batch({"b": 2})
    plan_id = saved_plans.save(writer.layout, writer.pipeline, a_plan())
    # Compaction commits a new state version that changes no row.
    state = DeltaTable(str(writer.path))
    state.optimize.compact(
        commit_properties=CommitProperties(custom_metadata={"platform_operation": MAINTAIN})
    )
    assert state.version() == 3
    reviewed = saved_plans.load(writer.layout, plan_id, "rewind")
    saved_plans.check_unmoved(writer.layout, writer.pipeline.version, reviewed)
    # Maintain's promise moved past the version the plan restores (7).
    details = {"phase": STARTED, "kept_state_version": 8}
    append_audit(writer.layout, audit_row(writer.pipeline, MAINTAIN, 0, details))
    with pytest.raises(ConfigError, match="maintain removed the files of state version 7"):
        saved_plans.check_unmoved(writer.layout, writer.pipeline.version, reviewed)


@pytest.mark.parametrize(
    ("plan_id", "message"),
    [
        ("../../etc/passwd", "a plan id looks like"),
        ("20261123T101500Z-1a2b3c4d", "no saved plan 20261123T101500Z-1a2b3c4d"),
    ],
)
def test_bad_plan_ids(tmp_path: Path, plan_id: str, message: str) -> None:
    layout = AppLayout(tmp_path, "user_clicks")
    tables.ensure_tables(layout, resolution.of(clicks_pipeline()))
    with pytest.raises(ConfigError, match=message):
        saved_plans.load(layout, plan_id, "rewind")


def test_a_plan_of_another_operation_is_refused(tmp_path: Path) -> None:
    writer = StateWriter(tmp_path, clicks_pipeline())
    plan_id = saved_plans.save(writer.layout, writer.pipeline, a_plan())
    with pytest.raises(ConfigError, match="is a rewind of user_clicks, not a backfill"):
        saved_plans.load(writer.layout, plan_id, "backfill")


def test_a_reviewed_plan_whose_apply_died_after_its_fence_completes_on_a_retry(
    tmp_path: Path,
) -> None:
    from jobs.cut import fenced_tables
    from jobs.delta.writer import OperationFence, bump_epoch

    writer = StateWriter(tmp_path, clicks_pipeline())
    first = writer.batch({"a": 1})
    writer.batch({"a": 2})
    layout, pipeline = writer.layout, writer.pipeline
    plan = dataclasses.replace(
        a_plan(), epoch_before=0, epoch_after=1, restore_version=first, seed_state_version=first
    )
    plan_id = saved_plans.save(layout, pipeline, plan)
    reviewed = saved_plans.load(layout, plan_id, "rewind")

    def dies_after_its_fence(epoch: int, plan_of_attempt: Plan) -> None:
        # What apply_plan does before it dies: the bump with its "started" row, then
        # the restore of ``state`` (a retry must undo it, not be refused by it).
        started = {"reason": "replay", "plan": plan_of_attempt.to_dict(), "phase": STARTED}
        bump_epoch(
            fenced_tables(layout, pipeline),
            pipeline.application_id,
            epoch,
            "replay",
            first_rows=audit_row(pipeline, "rewind", epoch, started),
        )
        fence = OperationFence(pipeline.application_id, epoch, "rewind", {"reason": "x"})
        table = DeltaTable(str(writer.path))
        table.restore(first, commit_properties=fence.on(table))

    dies_after_its_fence(1, reviewed.plan)
    retry = saved_plans.check_unmoved(layout, pipeline.version, reviewed)
    assert (retry.epoch_before, retry.epoch_after) == (1, 2)
    assert dataclasses.replace(retry, epoch_before=0, epoch_after=1) == reviewed.plan
    # The retry died too: the next one takes up from the newest attempt.
    dies_after_its_fence(2, retry)
    again = saved_plans.check_unmoved(layout, pipeline.version, reviewed)
    assert (again.epoch_before, again.epoch_after) == (2, 3)


def test_another_operations_dead_attempt_still_moves_a_plan(tmp_path: Path) -> None:
    from jobs.cut import fenced_tables
    from jobs.delta.writer import bump_epoch

    writer = StateWriter(tmp_path, clicks_pipeline())
    layout, pipeline = writer.layout, writer.pipeline
    plan = dataclasses.replace(a_plan(), epoch_before=0, epoch_after=1)
    reviewed = saved_plans.load(layout, saved_plans.save(layout, pipeline, plan), "rewind")
    other = {"reason": "other", "plan": {**plan.to_dict(), "plan_id": None}, "phase": STARTED}
    bump_epoch(
        fenced_tables(layout, pipeline),
        pipeline.application_id,
        1,
        "other",
        first_rows=audit_row(pipeline, "rewind", 1, other),
    )
    with pytest.raises(ConfigError, match="the epoch moved from 0 to 1"):
        saved_plans.check_unmoved(layout, pipeline.version, reviewed)


def test_a_saved_plan_is_never_replaced(tmp_path: Path) -> None:
    """A zombie first attempt of an Airflow run (the same plan id in every attempt)
    must not replace the plan a person approved: a plan is created put-if-absent.
    Another operation under a saved id is refused; the same operation again (a
    retried task, made when the stream had moved on) keeps the saved plan."""
    writer = StateWriter(tmp_path, clicks_pipeline())
    approved = saved_plans.save(writer.layout, writer.pipeline, a_plan(), plan_id=PLAN)
    stored = (saved_plans.plans_dir(writer.layout) / f"{PLAN}.json").read_bytes()
    other = dataclasses.replace(a_plan(), reason="something else", target_offsets={})
    saved_plans.save(writer.layout, writer.pipeline, other, plan_id=PLAN)  # kept the first
    assert (saved_plans.plans_dir(writer.layout) / f"{PLAN}.json").read_bytes() == stored
    assert saved_plans.load(writer.layout, approved, "rewind").plan.reason == "replay"
    rebuild = dataclasses.replace(a_plan(), operation="rebuild")
    with pytest.raises(ConfigError, match=f"plan {PLAN} .* is a rewind"):
        saved_plans.save(writer.layout, writer.pipeline, rebuild, plan_id=PLAN)


def test_the_digest_shown_for_approval_is_checked_at_apply(tmp_path: Path) -> None:
    writer = StateWriter(tmp_path, clicks_pipeline())
    saved_plans.save(writer.layout, writer.pipeline, a_plan(), plan_id=PLAN)
    stored = (saved_plans.plans_dir(writer.layout) / f"{PLAN}.json").read_bytes()
    digest = hashlib.sha256(stored).hexdigest()  # what a reviewer is shown
    loaded = saved_plans.load(writer.layout, PLAN, "rewind", digest=digest)
    assert loaded.digest == digest
    assert saved_plans.load(writer.layout, PLAN, "rewind", digest=digest[:12]).digest == digest
    with pytest.raises(ConfigError, match="is not the plan that was reviewed"):
        saved_plans.load(writer.layout, PLAN, "rewind", digest="0" * 64)
    for bad in ("", "xyz", "0" * 65, "abc"):
        with pytest.raises(ConfigError, match="a plan digest is"):
            saved_plans.load(writer.layout, PLAN, "rewind", digest=bad)
