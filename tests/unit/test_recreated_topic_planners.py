"""The planners after a topic was deleted and recreated, without Spark or a broker.

Epoch 0 read ``clicks`` (its old log, two partitions) and ``views``. ``clicks`` was
deleted and recreated with one partition; the rewind that moved the application
onto its new log keeping the state began epoch 1 (the floor: its state holds the
deleted log's judgments, which no broker can replay). Epoch 1 then ran two batches.
Every recomputation "from the first offsets" must start at the floor, never before
it and never from empty state."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from jobs import resolution
from jobs.cut import Cut, StateAction, write_cut
from jobs.delta import layout as tables
from jobs.delta.layout import AppLayout
from jobs.delta.writer import bump_epoch
from jobs.errors import KafkaUnavailableError
from jobs.operations import backfill, restart
from jobs.operations.targets import TargetSpec
from jobs.pipeline.parser import load_pipeline
from jobs.settings import REPO_ROOT, Settings, load_settings
from tests import ledger_rows as ledger

PIPELINE = dataclasses.replace(
    load_pipeline("user_clicks", REPO_ROOT / "include" / "pipelines"), topics=("clicks", "views")
)
C0, C1, V0 = ("clicks", 0), ("clicks", 1), ("views", 0)
IDS = {"clicks": "new", "views": "v"}


def offsets(clicks: int, views: int, clicks_1: int | None = None) -> str:
    parts = {"0": clicks} if clicks_1 is None else {"0": clicks, "1": clicks_1}
    return json.dumps({"clicks": parts, "views": {"0": views}})


def batch(epoch: int, batch_id: int, start: str, end: str, state_after: int) -> dict:  # type: ignore[type-arg]
    return ledger.batch_row(
        epoch, batch_id, 0, 0, state_after, start_offsets=start, end_offsets=end
    )


def bump(layout: AppLayout, epoch: int) -> None:
    bump_epoch([layout.table(tables.LEDGER)], layout.application_id, epoch, "test")


@pytest.fixture
def marks() -> dict[tuple[str, int], tuple[int, int]]:
    return {C0: (0, 1000), V0: (0, 600)}


@pytest.fixture
def layout(tmp_path: Path) -> AppLayout:
    layout = AppLayout(tmp_path, PIPELINE.application_id)
    # Epoch 0 first read the old log's clicks[1] from 200 (it started at "latest").
    write_cut(
        layout,
        Cut(0, json.loads(offsets(0, 0, 200)), "pipeline", topic_ids={**IDS, "clicks": "old"}),
    )
    ledger.append(
        layout,
        [
            batch(
                0,
                b,
                offsets(300 * b, 100 * b, 200 + 100 * b),
                offsets(300 * (b + 1), 100 * (b + 1), 300 + 100 * b),
                b + 1,
            )
            for b in range(3)
        ],
    )
    # The floor: a skip rewind of clicks to its new log's start, state kept (version 4).
    bump(layout, 1)
    write_cut(layout, Cut(1, json.loads(offsets(0, 300)), "rewind", topic_ids=IDS))
    keep = {"state_action": "keep", "boundary": {"epoch": 0, "batch_id": 2}}
    ledger.append(
        layout,
        [
            ledger.operation_done(1, "rewind", keep, 4),
            batch(1, 0, offsets(0, 300), offsets(500, 400), 5),
            batch(1, 1, offsets(500, 400), offsets(800, 500), 6),
        ],
    )
    state_versions(layout, 7)
    return layout


def state_versions(layout: AppLayout, count: int) -> None:
    """The application's tables, with ``count`` loadable state versions (0..count-1)."""
    tables.ensure_tables(layout, resolution.of(PIPELINE))
    state = DeltaTable(str(layout.table("state")))
    empty = pa.Table.from_batches([], schema=pa.schema(state.schema().to_arrow()))
    for _ in range(count - 1):
        write_deltalake(str(layout.table("state")), empty, mode="append")


@pytest.fixture
def settings(layout: AppLayout, monkeypatch: pytest.MonkeyPatch, marks) -> Settings:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(restart, "broker_marks", lambda *_a, **_k: ({}, marks))
    monkeypatch.setattr(backfill, "broker_marks", lambda *_a, **_k: ({}, marks))
    monkeypatch.setattr(restart.kafka_admin, "topic_ids", lambda *_a: dict(IDS))
    return dataclasses.replace(load_settings(), warehouse=layout.warehouse)


def test_a_rewind_of_every_topic_before_the_floor_restores_the_floor(settings) -> None:  # type: ignore[no-untyped-def]
    # views' earliest (0) is before the floor's views offset (300): no boundary is at
    # or before the target, and emptied state would lose the deleted log's judgments.
    spec = TargetSpec("earliest")
    plan = restart.plan_rewind(PIPELINE, settings, "bug", spec, "reprocess", None)
    assert plan.state_action is StateAction.RESTORE
    assert plan.boundary is not None and (plan.boundary.epoch, plan.boundary.batch_id) == (1, -1)
    assert plan.restore_version == 4
    assert plan.target_offsets == {C0: 0, V0: 300}
    assert "deleted log" in " ".join(plan.notes)


def test_a_backfill_from_an_offset_before_the_floor_says_it_starts_at_the_floor(settings) -> None:  # type: ignore[no-untyped-def]
    spec = TargetSpec("offset", offsets(0, 100))
    plan = backfill.plan_backfill(PIPELINE, settings, "fix", spec)
    assert plan.boundary is not None and plan.boundary.epoch == 1
    assert plan.read_from == {C0: 0, V0: 300}
    assert "views[0]" in " ".join(plan.notes) and "before" in " ".join(plan.notes)


def test_a_partition_added_to_the_new_log_is_read_from_its_own_start(settings, marks) -> None:  # type: ignore[no-untyped-def]
    # The new clicks grew a partition 1; no batch has read it. The deleted log's
    # clicks[1] was first read from 200: a position in a log that is gone.
    marks[C1] = (0, 50)
    plan = restart.plan_rebuild(PIPELINE, settings, "recompute", from_source=True)
    assert plan.target_offsets == {C0: 0, C1: 0, V0: 300}
    spec = TargetSpec("earliest")
    assert backfill.plan_backfill(PIPELINE, settings, "fix", spec).read_from[C1] == 0


def test_the_floor_stays_a_rewind_target_past_the_horizon_while_maintain_keeps_it(
    settings: Settings, layout: AppLayout
) -> None:
    # maintain promised versions from 6 and kept the floor's 4 by name (it is loadable).
    started = {"phase": "started", "kept_state_version": 6}
    ledger.append(layout, [{"entry_type": "maintain", "epoch": 1, "details": json.dumps(started)}])
    spec = TargetSpec("offset", offsets(100, 350))
    plan = restart.plan_rewind(PIPELINE, settings, "bug", spec, "reprocess", None)
    assert plan.boundary is not None and (plan.boundary.epoch, plan.boundary.batch_id) == (1, -1)


def test_a_rebuild_from_the_floor_does_not_claim_to_fill_the_floors_own_gap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One topic: the recreated clicks was skipped to 50 of its new log: 0..49 stay
    # out, before the floor's offsets; the replay starts at 50.
    layout = AppLayout(tmp_path, "user_clicks")
    write_cut(layout, Cut(0, {"clicks": {"0": 0}}, "pipeline", topic_ids={"clicks": "old"}))
    ledger.append(layout, [ledger.batch_row(0, 0, 0, 900, 1)])
    bump(layout, 1)
    write_cut(layout, Cut(1, {"clicks": {"0": 50}}, "rewind", topic_ids={"clicks": "new"}))
    keep = {
        "state_action": "keep",
        "boundary": {"epoch": 0, "batch_id": 0},
        "skipped": {"clicks[0]": [0, 50]},
    }
    ledger.append(
        layout, [ledger.operation_done(1, "rewind", keep, 2), ledger.batch_row(1, 0, 50, 400, 3)]
    )
    state_versions(layout, 4)
    monkeypatch.setattr(restart, "broker_marks", lambda *_a, **_k: ({}, {C0: (0, 500)}))
    monkeypatch.setattr(restart.kafka_admin, "topic_ids", lambda *_a: {"clicks": "new"})
    one_topic = load_pipeline("user_clicks", REPO_ROOT / "include" / "pipelines")
    settings = dataclasses.replace(load_settings(), warehouse=tmp_path)
    plan = restart.plan_rebuild(one_topic, settings, "recompute", from_source=True)
    assert plan.target_offsets == {C0: 50}
    assert not [n for n in plan.notes if "skip left out" in n], plan.notes


def test_a_skip_onto_a_recreated_topic_killed_after_its_fence_runs_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The skip fenced epoch 1 (its cut names the new log) and died before it was
    # done; the new log (1000) has outgrown the old position (900).
    layout = AppLayout(tmp_path, "user_clicks")
    write_cut(layout, Cut(0, {"clicks": {"0": 0}}, "pipeline", topic_ids={"clicks": "old"}))
    ledger.append(layout, [ledger.batch_row(0, 0, 0, 900, 1)])
    started = {"phase": "started", "plan": {}, "dry_run": False}
    bump(layout, 1)
    ledger.append(layout, [{"entry_type": "rewind", "epoch": 1, "details": json.dumps(started)}])
    write_cut(layout, Cut(1, {"clicks": {"0": 0}}, "rewind", topic_ids={"clicks": "new"}))
    monkeypatch.setattr(restart, "broker_marks", lambda *_a, **_k: ({}, {C0: (0, 1000)}))
    monkeypatch.setattr(restart.kafka_admin, "topic_ids", lambda *_a: {"clicks": "new"})
    one_topic = load_pipeline("user_clicks", REPO_ROOT / "include" / "pipelines")
    settings = dataclasses.replace(load_settings(), warehouse=tmp_path)
    plan = restart.plan_rewind(
        one_topic, settings, "again", TargetSpec("earliest"), "skip", ["clicks"]
    )
    assert plan.target_offsets == {C0: 0}
    assert plan.state_action is StateAction.KEEP


def test_a_reviewed_rewind_to_the_floor_still_applies_after_maintain(
    settings: Settings, layout: AppLayout
) -> None:
    from jobs.operations import saved_plans

    plan = restart.plan_rewind(PIPELINE, settings, "bug", TargetSpec("earliest"), "reprocess", None)
    plan_id = saved_plans.save(layout, PIPELINE, plan)
    started = {"phase": "started", "kept_state_version": 6}
    ledger.append(layout, [{"entry_type": "maintain", "epoch": 1, "details": json.dumps(started)}])
    reviewed = saved_plans.load(layout, plan_id, "rewind")
    assert saved_plans.check_unmoved(layout, PIPELINE.version, reviewed).restore_version == 4


@pytest.mark.parametrize("mode", ["skip", "reprocess"])
def test_a_partition_a_broker_behind_does_not_list_is_not_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    # clicks grew a partition 1, read to 500. A broker that has not applied the
    # addition lists only partition 0; the id is the same, so the topic was not
    # recreated (Kafka never removes a partition). A plan without clicks[1] would
    # have the next run read it again from its start: counted twice.
    layout = AppLayout(tmp_path, "user_clicks")
    write_cut(layout, Cut(0, {"clicks": {"0": 0, "1": 0}}, "pipeline", topic_ids={"clicks": "id"}))
    end = json.dumps({"clicks": {"0": 900, "1": 500}})
    ledger.append(
        layout,
        [ledger.batch_row(0, 0, 0, 0, 1, start_offsets=offsets_of(0, 0), end_offsets=end)],
    )
    state_versions(layout, 2)
    monkeypatch.setattr(restart, "broker_marks", lambda *_a, **_k: ({}, {C0: (0, 1000)}))
    monkeypatch.setattr(restart.kafka_admin, "topic_ids", lambda *_a: {"clicks": "id"})
    one_topic = load_pipeline("user_clicks", REPO_ROOT / "include" / "pipelines")
    settings = dataclasses.replace(load_settings(), warehouse=tmp_path)
    with pytest.raises(KafkaUnavailableError, match=r"clicks\[1\].*run again"):
        restart.plan_rewind(one_topic, settings, "r", TargetSpec("latest"), mode, None)
    with pytest.raises(KafkaUnavailableError, match=r"clicks\[1\]"):
        restart.plan_rebuild(one_topic, settings, "r", from_source=True)
    monkeypatch.setattr(backfill, "broker_marks", lambda *_a, **_k: ({}, {C0: (0, 1000)}))
    with pytest.raises(KafkaUnavailableError, match=r"clicks\[1\]"):
        backfill.plan_backfill(one_topic, settings, "fix", TargetSpec("earliest"))


def offsets_of(p0: int, p1: int) -> str:
    return json.dumps({"clicks": {"0": p0, "1": p1}})
