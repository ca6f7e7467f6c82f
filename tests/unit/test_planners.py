"""Rebuild and rewind planners without Spark or a broker: a hand-written ledger and
broker watermarks in, a plan (the cut to start from) out."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from jobs.cut import Cut, StateAction, write_cut
from jobs.delta import layout as tables
from jobs.delta.layout import AppLayout
from jobs.errors import ConfigError, SourceError
from jobs.operations import restart
from jobs.operations.targets import TargetSpec
from jobs.pipeline import load_pipeline
from jobs.settings import REPO_ROOT, load_settings

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
    write_cut(layout, Cut(0, {"clicks": {"0": 0}}, "pipeline"))
    path = layout.table(tables.LEDGER)
    path.parent.mkdir(parents=True, exist_ok=True)
    DeltaTable.create(str(path), tables.LEDGER_SCHEMA)
    rows = [
        {
            "application_id": PIPELINE.application_id,
            "entry_type": "batch",
            "epoch": 0,
            "batch_id": b,
            "start_offsets": json.dumps({"clicks": {"0": 300 * b}}),
            "end_offsets": json.dumps({"clicks": {"0": 300 * (b + 1)}}),
            "pipeline_version": 1,
            "processing_guarantee": "exactly_once",
            "delta_versions": json.dumps({"state_after": b + 1}),
            "watermark_ms": 1000 * b,
            "commit_time": int(time.time() * 1_000_000),
        }
        for b in range(3)
    ]
    write_deltalake(str(path), pa.Table.from_pylist(rows, tables.LEDGER_SCHEMA), mode="append")
    monkeypatch.setattr(restart, "broker_marks", lambda *_a, **_k: ({}, marks))
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
    assert restart.watermark_floor(layout, rebuild) == 2000  # the last boundary's
    spec = TargetSpec("shift", "-100")
    rewind = restart.plan_rewind(PIPELINE, settings, "x", spec, "reprocess", None)
    assert restart.watermark_floor(layout, rewind) == 1000  # restored to batch 1
    replay = restart.plan_rebuild(PIPELINE, settings, "x", from_source=True)
    assert restart.watermark_floor(layout, replay) == 0  # emptied: every window reopens
    backfill = dataclasses.replace(rewind, state_action=StateAction.PUBLISH)
    assert restart.watermark_floor(layout, backfill) == 2000  # the highest the stream had


def test_rewind_skip_back_is_allowed_only_for_a_topic_with_a_new_id(settings, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    layout = AppLayout(settings.warehouse, PIPELINE.application_id)
    write_cut(layout, Cut(0, {"clicks": {"0": 0}}, "pipeline", topic_ids={"clicks": "old-id"}))
    ids = {"clicks": "old-id"}
    monkeypatch.setattr(restart.kafka_admin, "topic_ids", lambda *_a: dict(ids))
    with pytest.raises(ConfigError, match="only moves forward"):
        restart.plan_rewind(PIPELINE, settings, "x", TargetSpec("earliest"), "skip", None)
    ids["clicks"] = "new-id"  # deleted and recreated; its new log (1000) outgrew 900
    plan = restart.plan_rewind(PIPELINE, settings, "x", TargetSpec("earliest"), "skip", None)
    assert plan.target_offsets == {TP: 0} and plan.state_action is StateAction.KEEP
    assert plan.reset_topics == ["clicks"]
