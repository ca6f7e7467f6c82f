"""Planning and applying the restarts: rebuild and rewind (backfill publishes first,
then restarts the same way).

The planners are pure reads (ledger, broker watermarks) that return a ``Plan``: the
cut's offsets, the snapshot version and the state action. ``apply_plan`` hands the
cut to ``jobs.cut.apply_cut`` (seed, cut file, fence of every table, orphan
removal), applies the state action in one commit, and records the result; the next
``run`` starts the new epoch from the cut.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable

from jobs import kafka_admin, monitoring_group
from jobs import resolved as resolution
from jobs.audit import append_audit, audit_row
from jobs.coverage import Boundary, Coverage, pins_text, spelled
from jobs.cut import (
    Cut,
    StateAction,
    apply_cut,
    boundary_at_or_before,
    check_readable,
    check_state_shape,
    current_log_history,
    epochs_on_other_logs,
    fill_from_first,
    floor_note,
    latest_cut,
    lineage_head,
    log_floor,
    read_cut,
    recorded_definition,
    replay_from_origin,
    state_behind,
)
from jobs.delta import layout as tables
from jobs.delta.layout import AppLayout
from jobs.delta.writer import fenced_properties
from jobs.errors import ConfigError
from jobs.faults import maybe_crash
from jobs.kafka_source import offsets as kafka_offsets
from jobs.ledger import current_epoch, snapshot, unfinished_epochs
from jobs.operations.plan import Plan, header
from jobs.operations.targets import TargetSpec, resolve_targets
from jobs.pipeline import Pipeline
from jobs.settings import Settings
from jobs.snapshot import open_windows, seed_rows
from jobs.warehouse import Location

Offsets = kafka_offsets.Offsets


def broker_marks(
    pipeline: Pipeline, settings: Settings, topics: list[str] | None = None
) -> tuple[dict[str, str], dict[tuple[str, int], tuple[int, int]]]:
    config = kafka_admin.client_config(settings.bootstrap_servers, settings.kafka_client)
    chosen = topics or list(pipeline.topics)
    unknown = sorted(set(chosen) - set(pipeline.topics))
    if unknown:
        raise ConfigError(f"--topics {unknown} are not topics of {pipeline.application_id}")
    partitions = kafka_admin.topic_partitions(
        kafka_admin.admin(config), chosen, settings.bootstrap_servers
    )
    marks = kafka_admin.watermarks(config, [(t, p) for t, ps in partitions.items() for p in ps])
    return config, marks


def plan_rebuild(pipeline: Pipeline, settings: Settings, reason: str, from_source: bool) -> Plan:
    layout = AppLayout(settings.warehouse, pipeline.application_id)
    epoch = current_epoch(layout)
    last = lineage_head(layout)
    current = last.end_offsets if last else {}
    if from_source or last is None:
        _config, marks = broker_marks(pipeline, settings)
        floor = log_floor(layout)
        if floor is not None:  # a topic recreated: from its new log's first offsets
            target = fill_from_first(layout, floor.end_offsets, marks)
            return Plan(
                **header("rebuild", pipeline.application_id, reason, epoch, current),
                target_offsets=target,
                seed_state_version=floor.state_version,
                state_action=StateAction.RESTORE,
                restore_version=floor.state_version,
                boundary=floor,
                records_to_replay=sum(current.get(tp, off) - off for tp, off in target.items()),
                notes=[
                    "recomputes from the cut of the repair that moved onto a recreated "
                    "topic's new log (the new log's first offsets)",
                    floor_note(floor),
                    *replay_notes(layout, pipeline, floor),
                ],
            )
        target = replay_from_origin(layout, marks, "rebuild --from-source")
        return Plan(
            **header("rebuild", pipeline.application_id, reason, epoch, current),
            target_offsets=target,
            seed_state_version=None,
            state_action=StateAction.EMPTY,
            records_to_replay=sum(current.get(tp, off) - off for tp, off in target.items()),
            notes=[
                "recomputes from the application's first offsets; the published state is "
                "empty until the replay has caught up",
                *replay_notes(layout, pipeline),
            ],
        )
    return Plan(
        **header("rebuild", pipeline.application_id, reason, epoch, current),
        target_offsets=dict(current),
        seed_state_version=last.state_version,
        state_action=StateAction.KEEP,
        boundary=last,
        notes=["restores Spark's state from Delta; Kafka is not re-read"],
    )


def plan_rewind(
    pipeline: Pipeline,
    settings: Settings,
    reason: str,
    spec: TargetSpec,
    mode: str,
    topics: list[str] | None,
) -> Plan:
    layout = AppLayout(settings.warehouse, pipeline.application_id)
    epoch = current_epoch(layout)
    last = lineage_head(layout)
    if last is None:
        raise ConfigError(f"{pipeline.application_id} has no committed batch: nothing to rewind")
    current = last.end_offsets
    config, marks = broker_marks(pipeline, settings, topics)
    chosen = resolve_targets(spec, current, marks, config)
    selected = set(topics or pipeline.topics)
    # Partitions of other topics stay where they are; partitions of the selected
    # topics that no longer exist (a topic recreated with fewer) are dropped.
    target = {
        tp: off for tp, off in current.items() if tp[0] not in selected or tp in marks
    } | chosen
    base: dict[str, Any] = {
        **header("rewind", pipeline.application_id, reason, epoch, current),
        "reset_topics": sorted(selected),
    }
    if mode == "skip":
        return _plan_skip(pipeline, settings, layout, last, chosen, marks, target, base)
    return _plan_reprocess(pipeline, settings, layout, current, chosen, marks, target, base)


def _plan_skip(
    pipeline: Pipeline,
    settings: Settings,
    layout: AppLayout,
    last: Boundary,
    chosen: Offsets,
    marks: dict[tuple[str, int], tuple[int, int]],
    target: Offsets,
    base: dict[str, Any],
) -> Plan:
    """Skip to ``chosen``: the state is kept, the records between are not counted."""
    current = last.end_offsets
    # Going back is refused (it would count records twice), except where the
    # log now ends below the committed offset: those offsets hold new records of
    # a recreated topic, never counted.
    recreated = recreated_topics(pipeline, settings, layout, last.epoch)
    backwards = {
        tp: (current.get(tp), off)
        for tp, off in chosen.items()
        if off < current.get(tp, off) and current[tp] <= marks[tp][1] and tp[0] not in recreated
    }
    if backwards:
        raise ConfigError(
            f"--mode skip only moves forward (it keeps the state); these would go back: "
            f"{_names(backwards)}; use --mode reprocess"
        )
    # A partition the application has not read yet (added to the topic since), or
    # of a recreated topic, is read from its log start: skipping it skips from there.
    start = {
        tp: marks[tp][0] if tp[0] in recreated else current.get(tp, marks[tp][0]) for tp in chosen
    }
    skipped = {
        f"{tp[0]}[{tp[1]}]": [start[tp], off] for tp, off in chosen.items() if off > start[tp]
    }
    restarted = {tp: off for tp, off in chosen.items() if off < current.get(tp, off)}
    if restarted:
        base["notes"] = [
            f"{_names({tp: (None, off) for tp, off in restarted.items()})}: the topic was "
            "recreated (new topic id, or a log that ends below the committed offset): "
            "read from the target, state kept"
        ]
    return Plan(
        **base,
        target_offsets=target,
        seed_state_version=last.state_version,
        state_action=StateAction.KEEP,
        boundary=last,
        skipped=skipped,
    )


def _plan_reprocess(
    pipeline: Pipeline,
    settings: Settings,
    layout: AppLayout,
    current: Offsets,
    chosen: Offsets,
    marks: dict[tuple[str, int], tuple[int, int]],
    target: Offsets,
    base: dict[str, Any],
) -> Plan:
    """Go back to the boundary at or before ``target``: its state restored, the
    records after it replayed."""
    boundary = boundary_at_or_before(layout, target, other_logs(pipeline, settings, layout))
    if boundary is None:
        origin = replay_from_origin(layout, marks, "a rewind before the first batch")
        return Plan(
            **base,
            target_offsets=origin | {tp: off for tp, off in current.items() if tp not in marks},
            seed_state_version=None,
            state_action=StateAction.EMPTY,
            records_to_replay=sum(current.get(tp, off) - off for tp, off in origin.items()),
            notes=[
                "no batch ended at or before the target: replays from the application's "
                "first offsets",
                *replay_notes(layout, pipeline),
            ],
        )
    notes = []
    if boundary.floor:
        notes.append(floor_note(boundary, target))
    elif boundary.end_offsets != target:
        notes.append(
            f"the target {_names({tp: (None, off) for tp, off in chosen.items()})} is not a "
            "batch boundary: replay starts at the boundary at or before it"
        )
    return Plan(
        **base,
        target_offsets=dict(boundary.end_offsets),
        seed_state_version=boundary.state_version,
        state_action=StateAction.RESTORE,
        restore_version=boundary.state_version,
        boundary=boundary,
        records_to_replay=sum(current.values()) - sum(boundary.end_offsets.values()),
        notes=[*notes, *replay_notes(layout, pipeline, boundary)],
    )


def replay_notes(layout: AppLayout, pipeline: Pipeline, since: Boundary | None = None) -> list[str]:
    """What a replay from ``since`` (None: the first offsets) judges beyond what it
    re-reads, said in the plan: the ranges a skip left out after it (a gap is never
    filled silently), and the dimension versions its records join (those their
    earlier batches recorded, each still readable, or one error naming it)."""
    snap = snapshot(layout)
    if snap is None:
        return []
    history = current_log_history(layout, snap)
    gaps = history.head.gaps_since(Coverage() if since is None else history.coverage_at(since))
    notes = [f"the replay also judges the ranges a skip left out ({spelled(gaps)})"] if gaps else []
    names = tuple(e.name for e in pipeline.enrich)
    decisions = history.replay_decisions({} if since is None else since.end_offsets, names)
    for i, e in enumerate(pipeline.enrich):
        pins = {d[6 + i] for d in decisions if d[6 + i] is not None}
        path = e.path(layout.warehouse)
        check_readable(pipeline.application_id, e.name, path, pins)
        if pins:
            notes.append(
                f"the replayed records join {e.name} at the versions their first batches "
                f"recorded ({pins_text(pins, path)})"
            )
        if any(d[6 + i] is None for d in decisions):
            notes.append(
                f"the replayed records of batches from before {e.name} was added (a pipeline "
                "version without it) join it at the version committed at their batch's "
                "time, or its oldest if it did not exist yet"
            )
    return notes


def _names(pairs: dict[tuple[str, int], tuple[Any, int]]) -> str:
    return ", ".join(f"{t}[{p}]->{off}" for (t, p), (_cur, off) in sorted(pairs.items()))


def broker_topic_ids(pipeline: Pipeline, settings: Settings) -> dict[str, str]:
    config = kafka_admin.client_config(settings.bootstrap_servers, settings.kafka_client)
    return kafka_admin.topic_ids(kafka_admin.admin(config), pipeline.topics)


def other_logs(pipeline: Pipeline, settings: Settings, layout: AppLayout) -> frozenset[int]:
    """Epochs whose offsets are in an earlier log of a topic than the broker's now:
    no boundary of theirs compares with a target in the new log."""
    return epochs_on_other_logs(layout, broker_topic_ids(pipeline, settings))


def recreated_topics(
    pipeline: Pipeline, settings: Settings, layout: AppLayout, epoch: int
) -> set[str]:
    """Topics whose id differs from the one recorded by the cut ``epoch`` (the
    lineage head's: an operation that died after its fence wrote a newer one)
    began with."""
    cut = latest_cut(layout, epoch)
    if cut is None or not cut.topic_ids:
        return set()
    now = broker_topic_ids(pipeline, settings)
    return {t for t, i in cut.topic_ids.items() if t in now and now[t] != i}


def checked_topic_ids(
    pipeline: Pipeline, settings: Settings, layout: AppLayout, plan: Plan
) -> dict[str, str]:
    """The topic ids the new cut records. A topic recreated since the current cut is
    accepted only when this operation points it at its new log (a rewind of it)."""
    now = broker_topic_ids(pipeline, settings)
    previous = read_cut(layout, plan.epoch_before)
    if previous is not None:
        kept = {t: i for t, i in previous.topic_ids.items() if t not in plan.reset_topics}
        kafka_admin.check_same_topics(kept, now)
    return now


def watermark_floor(layout: AppLayout, plan: Plan) -> int:
    """The watermark below which the new epoch treats windows as closed: where the
    state it starts from stands. Emptied state reopens everything; a backfill's
    published state has judged every record the stream read, with the stream's
    watermarks, so it continues from the highest one."""
    if plan.state_action is StateAction.PUBLISH:
        snap = snapshot(layout)
        return 0 if snap is None else snap.history().head.watermark_ms
    if plan.state_action is StateAction.EMPTY or plan.boundary is None:
        return 0
    return plan.boundary.watermark_ms


def check_seed_shape(layout: AppLayout, pipeline: Pipeline, plan: Plan) -> None:
    """A plan seeded from the published state at a boundary needs that state to
    have the pipeline's shape: the shape of the cut the boundary's epoch began with."""
    if plan.seed_state_version is None:
        return
    epoch = plan.epoch_before if plan.boundary is None else plan.boundary.epoch
    cut = latest_cut(layout, epoch)
    if cut is not None:
        check_state_shape(layout, pipeline, cut, new_checkpoint=True)


def apply_plan(
    pipeline: Pipeline,
    settings: Settings,
    plan: Plan,
    seed_override: pa.Table | None = None,
    publish: Callable[[], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Carry out ``plan`` (the caller holds the application lock)."""
    layout = AppLayout(settings.warehouse, pipeline.application_id)
    tables.ensure_tables(layout, resolution.load(layout, pipeline), plan.republishes)
    if current_epoch(layout) != plan.epoch_before:
        raise ConfigError("the application moved to another epoch since the plan was made")
    new = plan.epoch_after
    if plan.state_action is not StateAction.PUBLISH:  # a backfill checked before recomputing
        check_seed_shape(layout, pipeline, plan)
    state_path = layout.table("state")
    seed = _seed(state_path, pipeline, plan, seed_override)
    # What is in ``state`` beyond the ledger is undone first: batches merged after the
    # last boundary without their ledger row (fenced, or crashed), and the writes of
    # operations that died after their fence (this one completes them; their rows go
    # with the orphans). A KEEP plan restores to there; a PUBLISH publishes onto it,
    # so everything it changes reaches the changelog once. (A RESTORE goes back to a
    # boundary, before all of these.)
    unfinished = unfinished_epochs(layout)
    behind = state_behind(layout)
    action, restore_to = plan.state_action, plan.restore_version
    if behind is not None and action is StateAction.KEEP:
        action, restore_to = StateAction.RESTORE, behind
    cut = Cut(
        epoch=new,
        starting_offsets=kafka_offsets.to_json_dict(plan.target_offsets),
        origin=plan.operation,
        seed_rows=None if seed is None else seed.num_rows,
        watermark_ms=watermark_floor(layout, plan),
        topic_ids=checked_topic_ids(pipeline, settings, layout, plan),
        state_shape=pipeline.state_shape,
        definition=recorded_definition(pipeline),
    )
    offsets = (
        kafka_offsets.to_json_dict(plan.current_offsets),
        kafka_offsets.to_json_dict(plan.target_offsets),
    )
    details = {
        "reason": plan.reason,
        "plan": plan.to_dict(),
        "dry_run": False,
        "epoch_before": plan.epoch_before,
        "epoch_after": new,
    }
    props = fenced_properties(
        pipeline.application_id,
        new,
        plan.operation,
        {"reason": plan.reason, "pipeline_version": str(pipeline.version)},
    )
    # The bump commit on the ledger is the audit row: fenced and recorded at once.
    audit = audit_row(pipeline, plan.operation, new, {**details, "phase": "started"}, *offsets)
    orphans = apply_cut(layout, pipeline, cut, plan.reason, audit, props, seed, unfinished)
    maybe_crash("after_fence")
    if behind is not None and action is StateAction.PUBLISH:
        DeltaTable(str(state_path)).restore(behind, commit_properties=props)
    result: dict[str, Any] = {
        "seeded_rows": cut.seed_rows or 0,
        "state_action": action.value,
        "orphan_rows_removed": orphans,
    }
    if behind is not None:
        result["state_undone_to_version"] = behind
    result.update(_state_after(state_path, action, restore_to, props, publish))
    append_audit(
        layout,
        audit_row(
            pipeline, plan.operation, new, {**details, "phase": "done", "result": result}, *offsets
        ),
    )
    # Kafka's own tools show the application's lag from where the new epoch starts.
    config = kafka_admin.client_config(settings.bootstrap_servers, settings.kafka_client)
    monitoring_group.commit_once(config, pipeline.application_id, cut.starting_offsets)
    return result


def _seed(
    state_path: Location, pipeline: Pipeline, plan: Plan, seed_override: pa.Table | None
) -> pa.Table | None:
    """The rows Spark's state is seeded with: the plan's state version (or the
    given snapshot), its closed windows left out; None for an empty state."""
    state_rows = seed_override
    if state_rows is None and plan.seed_state_version is not None:
        state_rows = DeltaTable(str(state_path), version=plan.seed_state_version).to_pyarrow_table()
    if state_rows is not None:
        state_rows = open_windows(pa.table(state_rows), pipeline)
    return (
        seed_rows(state_rows, pipeline) if state_rows is not None and state_rows.num_rows else None
    )


def _state_after(
    state_path: Location,
    action: StateAction,
    restore_to: int | None,
    props: CommitProperties,
    publish: Callable[[], dict[str, Any]] | None,
) -> dict[str, Any]:
    """The plan's state action, fenced by ``props``: restored, emptied, published
    onto, or kept. Returns what it did and the state's version after it."""
    result: dict[str, Any] = {}
    if action is StateAction.RESTORE:
        assert restore_to is not None
        DeltaTable(str(state_path)).restore(restore_to, commit_properties=props)
        result["restored_version"] = restore_to
    elif action is StateAction.EMPTY:
        DeltaTable(str(state_path)).delete(commit_properties=props)
    elif action is StateAction.PUBLISH:
        assert publish is not None
        result.update(publish())
    result["state_version"] = DeltaTable(str(state_path)).version()
    return result


def audit_dry_run(pipeline: Pipeline, settings: Settings, plan: Plan) -> None:
    layout = AppLayout(settings.warehouse, pipeline.application_id)
    tables.ensure_tables(layout, resolution.load(layout, pipeline), plan.republishes)
    append_audit(
        layout,
        audit_row(
            pipeline,
            plan.operation,
            plan.epoch_before,
            {
                "reason": plan.reason,
                "plan": plan.to_dict(),
                "dry_run": True,
                "epoch_before": plan.epoch_before,
                "epoch_after": plan.epoch_before,
            },
            kafka_offsets.to_json_dict(plan.current_offsets),
            kafka_offsets.to_json_dict(plan.target_offsets),
        ),
    )
