"""Rebuild and rewind planners without Spark or a broker: a hand-written ledger and
broker watermarks in, a plan (the cut to start from) out."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from jobs.cut import Cut, StateAction
from jobs.delta import layout as tables
from jobs.delta.layout import AppLayout
from jobs.errors import ConfigError, SourceError
from jobs.operations import apply, restart
from jobs.operations.targets import TargetSpec
from jobs.pipeline.parser import load_pipeline
from jobs.settings import REPO_ROOT, load_settings
from tests import ledger_rows as ledger

PIPELINE = load_pipeline("user_clicks", REPO_ROOT / "include" / "pipelines")
TP = ("clicks", 0)


@pytest.fixture
def marks() -> dict[tuple[str, int], tuple[int, int]]:
    return {TP: (0, 1000)}


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, marks):  # type: ignore[no-untyped-def]
    """Epoch 0 read clicks[0] from offset 0 in three batches ending at 300, 600 and
    900 (state versions 1, 2, 3); the broker holds offsets 0..1000."""
    layout = AppLayout(tmp_path, PIPELINE.application_id)
    ledger.record_cut(layout, Cut(0, {"clicks": {"0": 0}}, "pipeline"))
    ledger.append(
        layout,
        [
            ledger.batch_row(0, b, 300 * b, 300 * (b + 1), b + 1, watermark_ms=1000 * b)
            for b in range(3)
        ],
    )
    monkeypatch.setattr(restart, "broker_marks", lambda *_a, **_k: ({}, marks))
    monkeypatch.setattr(restart.kafka_admin, "topic_ids", lambda *_a: {})  # ids unknown
    return dataclasses.replace(load_settings(), warehouse=tmp_path)


def test_rebuild_seeds_from_the_last_boundary(settings) -> None:  # type: ignore[no-untyped-def]
    plan = restart.plan_rebuild(PIPELINE, settings, "lost checkpoint", from_source=False)
    assert plan.state_action is StateAction.KEEP
    assert plan.target_offsets == {TP: 900}
    assert plan.seed_state_version == 3
    assert (plan.epoch_before, plan.epoch_after) == (0, 1)


def test_rebuild_from_source_replays_from_the_first_offsets_or_refuses(settings, marks) -> None:  # type: ignore[no-untyped-def]
    plan = restart.plan_rebuild(PIPELINE, settings, "recompute", from_source=True)
    assert plan.state_action is StateAction.EMPTY
    assert plan.target_offsets == {TP: 0}
    assert plan.records_to_replay == 900
    marks[TP] = (50, 1000)  # retention deleted 0..49 since
    with pytest.raises(SourceError, match=r"clicks\[0\].*0\.\.49"):
        restart.plan_rebuild(PIPELINE, settings, "recompute", from_source=True)


def test_rewind_reprocess_restores_the_boundary_at_or_before_the_target(settings) -> None:  # type: ignore[no-untyped-def]
    plan = restart.plan_rewind(
        PIPELINE, settings, "bug", TargetSpec("shift", "-100"), "reprocess", None
    )
    assert plan.state_action is StateAction.RESTORE
    assert plan.restore_version == 2
    assert plan.target_offsets == {TP: 600}
    assert plan.records_to_replay == 300


def test_rewind_before_the_first_batch_replays_from_the_origin(settings) -> None:  # type: ignore[no-untyped-def]
    spec = TargetSpec("offset", "100")
    plan = restart.plan_rewind(PIPELINE, settings, "bug", spec, "reprocess", None)
    assert plan.state_action is StateAction.EMPTY
    assert plan.target_offsets == {TP: 0}


def test_rewind_skip_keeps_the_state_and_only_moves_forward(settings) -> None:  # type: ignore[no-untyped-def]
    plan = restart.plan_rewind(PIPELINE, settings, "skip junk", TargetSpec("latest"), "skip", None)
    assert plan.state_action is StateAction.KEEP
    assert plan.target_offsets == {TP: 1000}
    assert plan.skipped == {"clicks[0]": [900, 1000]}
    with pytest.raises(ConfigError, match="only moves forward"):
        restart.plan_rewind(PIPELINE, settings, "x", TargetSpec("earliest"), "skip", None)


def test_rewind_skip_to_the_start_of_a_recreated_topic_keeps_the_state(settings, marks) -> None:  # type: ignore[no-untyped-def]
    marks[TP] = (0, 40)  # the log now ends below the committed 900: a new topic
    plan = restart.plan_rewind(
        PIPELINE, settings, "recreated", TargetSpec("earliest"), "skip", None
    )
    assert plan.state_action is StateAction.KEEP
    assert plan.target_offsets == {TP: 0}
    assert plan.seed_state_version == 3
    assert "the topic was recreated" in " ".join(plan.notes)


def test_the_new_epochs_watermark_floor_follows_the_state_it_starts_from(settings) -> None:  # type: ignore[no-untyped-def]
    layout = AppLayout(settings.warehouse, PIPELINE.application_id)
    rebuild = restart.plan_rebuild(PIPELINE, settings, "x", from_source=False)
    assert apply.watermark_floor(layout, rebuild) == 2000  # the last boundary's
    spec = TargetSpec("shift", "-100")
    rewind = restart.plan_rewind(PIPELINE, settings, "x", spec, "reprocess", None)
    assert apply.watermark_floor(layout, rewind) == 1000  # restored to batch 1
    replay = restart.plan_rebuild(PIPELINE, settings, "x", from_source=True)
    assert apply.watermark_floor(layout, replay) == 0  # emptied: every window reopens
    backfill = dataclasses.replace(rewind, state_action=StateAction.PUBLISH)
    assert apply.watermark_floor(layout, backfill) == 2000  # the highest the stream had


def test_rewind_skip_back_is_allowed_only_for_a_topic_with_a_new_id(settings, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    layout = AppLayout(settings.warehouse, PIPELINE.application_id)
    ledger.record_cut(
        layout, Cut(0, {"clicks": {"0": 0}}, "pipeline", topic_ids={"clicks": "old-id"})
    )
    ids = {"clicks": "old-id"}
    monkeypatch.setattr(restart.kafka_admin, "topic_ids", lambda *_a: dict(ids))
    with pytest.raises(ConfigError, match="only moves forward"):
        restart.plan_rewind(PIPELINE, settings, "x", TargetSpec("earliest"), "skip", None)
    ids["clicks"] = "new-id"  # deleted and recreated; its new log (1000) outgrew 900
    plan = restart.plan_rewind(PIPELINE, settings, "x", TargetSpec("earliest"), "skip", None)
    assert plan.target_offsets == {TP: 0} and plan.state_action is StateAction.KEEP
    assert plan.reset_topics == ["clicks"]


def append_rows(settings, rows: list[dict]) -> None:  # type: ignore[no-untyped-def, type-arg]
    ledger.append(AppLayout(settings.warehouse, PIPELINE.application_id), rows)


def bump(settings, epoch: int) -> None:  # type: ignore[no-untyped-def]
    from jobs.delta.writer import bump_epoch

    layout = AppLayout(settings.warehouse, PIPELINE.application_id)
    bump_epoch([layout.table(tables.LEDGER)], PIPELINE.application_id, epoch, "test")


def test_a_rewind_never_restores_a_state_an_earlier_rewind_discarded(settings) -> None:  # type: ignore[no-untyped-def]
    # Epoch 0 (a buggy version) ended batches at 300, 600, 900. A rewind to 300
    # (epoch 1) discarded batches 1 and 2 and replayed 300..900 in one batch.
    bump(settings, 1)
    restore = {"state_action": "restore", "boundary": {"epoch": 0, "batch_id": 0}}
    append_rows(
        settings,
        [ledger.operation_done(1, "rewind", restore, 4), ledger.batch_row(1, 0, 300, 900, 5)],
    )
    # A second rewind to 650: epoch 0's boundary at 600 is a discarded state.
    spec = TargetSpec("offset", "650")
    plan = restart.plan_rewind(PIPELINE, settings, "again", spec, "reprocess", None)
    assert plan.boundary is not None
    assert (plan.boundary.epoch, plan.boundary.batch_id) == (0, 0)
    assert plan.restore_version == 1
    assert plan.target_offsets == {TP: 300}


def test_a_rewind_never_picks_a_boundary_in_a_deleted_topics_log(settings, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    layout = AppLayout(settings.warehouse, PIPELINE.application_id)
    ledger.record_cut(layout, Cut(0, {"clicks": {"0": 0}}, "pipeline", topic_ids={"clicks": "old"}))
    # The topic was recreated; a skip rewind pointed epoch 1 at the new log's start.
    bump(settings, 1)
    ledger.record_cut(layout, Cut(1, {"clicks": {"0": 0}}, "rewind", topic_ids={"clicks": "new"}))
    keep = {"state_action": "keep", "boundary": {"epoch": 0, "batch_id": 2}}
    append_rows(
        settings, [ledger.operation_done(1, "rewind", keep, 3), ledger.batch_row(1, 0, 0, 500, 4)]
    )
    monkeypatch.setattr(restart.kafka_admin, "topic_ids", lambda *_a: {"clicks": "new"})
    spec = TargetSpec("offset", "950")
    plan = restart.plan_rewind(PIPELINE, settings, "x", spec, "reprocess", None)
    assert plan.boundary is not None
    # Epoch 0's 900 is a position in the deleted log, not the new log's 950.
    assert (plan.boundary.epoch, plan.boundary.batch_id) == (1, 0)
    assert plan.target_offsets == {TP: 500}


def test_a_rebuild_after_a_completed_backfill_continues_from_the_backfills_cut(settings) -> None:  # type: ignore[no-untyped-def]
    # A backfill began epoch 1 (to the head, 1000; it left state version 5); no
    # batch ran since. Then the recovery DAG's rebuild fenced the new stream (epoch 2).
    layout = AppLayout(settings.warehouse, PIPELINE.application_id)
    bump(settings, 1)
    ledger.record_cut(layout, Cut(1, {"clicks": {"0": 1000}}, "backfill", watermark_ms=2500))
    publish = {"state_action": "publish", "boundary": {"epoch": 0, "batch_id": 2}}
    append_rows(settings, [ledger.operation_done(1, "backfill", publish, 5)])
    bump(settings, 2)
    fence = {"reason": "recovery", "for": "rebuild"}
    append_rows(settings, [{"entry_type": "fence", "epoch": 2, "details": json.dumps(fence)}])
    plan = restart.plan_rebuild(PIPELINE, settings, "recovery", from_source=False)
    # Not epoch 0's last batch (900, version 3): that would undo the backfill.
    assert plan.target_offsets == {TP: 1000}
    assert plan.seed_state_version == 5
    assert plan.boundary is not None and plan.boundary.epoch == 1
    assert apply.watermark_floor(layout, plan) == 2500


def test_a_backfill_reads_only_what_the_stream_has_judged(settings, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from jobs.operations import backfill

    # The broker holds 0..1000; the stream committed batches up to 900. Records
    # 900..1000 are judged (dead letters, watermark) by the stream's next batch.
    monkeypatch.setattr(backfill, "broker_marks", lambda *_a, **_k: ({}, {TP: (0, 1000)}))
    plan = backfill.plan_backfill(PIPELINE, settings, "fix", TargetSpec("earliest"))
    assert plan.read_from == {TP: 0}
    assert plan.target_offsets == {TP: 900}
    assert plan.records_to_replay == 900


def test_a_rewind_after_a_skip_never_replays_what_the_skip_skipped(settings) -> None:  # type: ignore[no-untyped-def]
    # A skip moved epoch 1 from 900 to 950 (state kept: version 3); no batch since.
    layout = AppLayout(settings.warehouse, PIPELINE.application_id)
    bump(settings, 1)
    ledger.record_cut(layout, Cut(1, {"clicks": {"0": 950}}, "rewind", watermark_ms=2000))
    keep = {"state_action": "keep", "boundary": {"epoch": 0, "batch_id": 2}}
    append_rows(settings, [ledger.operation_done(1, "rewind", keep, 3)])
    spec = TargetSpec("offset", "960")
    plan = restart.plan_rewind(PIPELINE, settings, "x", spec, "reprocess", None)
    # The skip's cut (950), not epoch 0's last batch (900): 900..950 stays skipped.
    assert plan.target_offsets == {TP: 950}
    assert plan.restore_version == 3


def test_a_backfill_after_a_backfill_keeps_the_stream_watermark(settings, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # The first backfill started from batch 0 (watermark 0) and reused the
    # judgments of batches 1 and 2 (watermark 2000): a second one continues from 2000.
    layout = AppLayout(settings.warehouse, PIPELINE.application_id)
    bump(settings, 1)
    ledger.record_cut(layout, Cut(1, {"clicks": {"0": 900}}, "backfill", watermark_ms=2000))
    publish = {"state_action": "publish", "boundary": {"epoch": 0, "batch_id": 0}}
    append_rows(settings, [ledger.operation_done(1, "backfill", publish, 5)])
    from jobs.operations import backfill

    monkeypatch.setattr(backfill, "broker_marks", lambda *_a, **_k: ({}, {TP: (0, 1000)}))
    plan = backfill.plan_backfill(PIPELINE, settings, "again", TargetSpec("earliest"))
    assert apply.watermark_floor(layout, plan) == 2000


def test_a_skip_over_a_partition_never_read_records_its_gap_from_the_log_start(  # type: ignore[no-untyped-def]
    settings, marks
) -> None:
    # clicks[1] was added after the last batch: the stream would read it from its
    # log start (0), so skipping it to 50 leaves 0..49 out, recorded as a gap.
    marks[("clicks", 1)] = (0, 80)
    spec = TargetSpec("offset", json.dumps({"clicks": {"0": 950, "1": 50}}))
    plan = restart.plan_rewind(PIPELINE, settings, "junk", spec, "skip", None)
    assert plan.skipped == {"clicks[0]": [900, 950], "clicks[1]": [0, 50]}


def test_a_rewind_to_before_a_skip_says_its_replay_judges_the_skipped_range(settings) -> None:  # type: ignore[no-untyped-def]
    # A skip moved epoch 1 from 900 to 950 (state kept: version 3), a batch read on.
    layout = AppLayout(settings.warehouse, PIPELINE.application_id)
    bump(settings, 1)
    ledger.record_cut(layout, Cut(1, {"clicks": {"0": 950}}, "rewind", watermark_ms=2000))
    keep = {
        "state_action": "keep",
        "boundary": {"epoch": 0, "batch_id": 2},
        "skipped": {"clicks[0]": [900, 950]},
    }
    append_rows(
        settings,
        [ledger.operation_done(1, "rewind", keep, 3), ledger.batch_row(1, 0, 950, 1000, 4)],
    )
    spec = TargetSpec("offset", "600")
    plan = restart.plan_rewind(PIPELINE, settings, "x", spec, "reprocess", None)
    assert plan.target_offsets == {TP: 600}
    assert "skip left out (clicks[0] 900..949)" in " ".join(plan.notes)
    later = restart.plan_rewind(
        PIPELINE, settings, "x", TargetSpec("offset", "960"), "reprocess", None
    )
    assert not [n for n in later.notes if "skip left out" in n]  # from the skip's cut on
