"""Planning the restarts: rebuild and rewind (a backfill plans its own and
restarts the same way).

The planners are pure reads (ledger, broker watermarks) that return a ``Plan``: the
cut's offsets, the snapshot version and the state action. ``operations/apply.py``
carries a plan out through the cut; the next ``run`` starts the new epoch from it.
"""

from __future__ import annotations

from typing import Any

from jobs import kafka_admin
from jobs.cut import (
    StateAction,
    boundary_at_or_before,
    check_readable,
    current_log_history,
    epochs_on_other_logs,
    fill_from_first,
    floor_note,
    latest_cut,
    lineage_head,
    log_floor,
    replay_from_origin,
    same_ids,
)
from jobs.delta.layout import AppLayout
from jobs.errors import ConfigError
from jobs.kafka_source import offsets as kafka_offsets
from jobs.ledger import current_epoch, current_ledger
from jobs.lineage import Boundary, Coverage, pins_text, spelled
from jobs.operations.plan import Plan, header
from jobs.operations.targets import TargetSpec, resolve_targets
from jobs.pipeline.model import Pipeline
from jobs.settings import Settings

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


def check_listed(
    pipeline: Pipeline,
    settings: Settings,
    layout: AppLayout,
    last: Boundary | None,
    marks: dict[tuple[str, int], tuple[int, int]],
    topics: list[str] | None = None,
) -> None:
    """A partition the application has read that the broker does not list is of a
    topic recreated with fewer partitions, or the listing came from a broker behind
    on metadata (Kafka never removes a partition). With the topic's id unchanged it
    is the second, and a plan without the partition would have the next run read it
    again from its start: refused, for the command to run again."""
    selected = set(topics or pipeline.topics)
    read = last.end_offsets if last is not None else {}
    unlisted = sorted(tp for tp in read if tp[0] in selected and tp not in marks)
    if not unlisted:
        return
    cut = latest_cut(layout, last.epoch) if last is not None else None
    recorded = cut.topic_ids if cut is not None else {}
    if not any(t in recorded for t, _p in unlisted):
        return  # no id to compare: the broker's listing decides (a recreated topic)
    same = same_ids(recorded, broker_topic_ids(pipeline, settings))
    kafka_offsets.check_continuity({tp: read[tp] for tp in unlisted if tp[0] in same}, {}, same)


def plan_rebuild(pipeline: Pipeline, settings: Settings, reason: str, from_source: bool) -> Plan:
    layout = AppLayout(settings.warehouse, pipeline.application_id)
    epoch = current_epoch(layout)
    last = lineage_head(layout)
    current = last.end_offsets if last else {}
    head = header("rebuild", pipeline.application_id, reason, epoch, current)
    if not from_source and last is not None:
        return Plan(
            **head,
            target_offsets=dict(current),
            seed_state_version=last.state_version,
            state_action=StateAction.KEEP,
            boundary=last,
            notes=["restores Spark's state from Delta; Kafka is not re-read"],
        )
    _config, marks = broker_marks(pipeline, settings)
    check_listed(pipeline, settings, layout, last, marks)
    floor = log_floor(layout)  # a topic recreated: from its new log's first offsets
    replayed = replay_notes(layout, pipeline, floor)
    if floor is not None:
        target = fill_from_first(layout, floor.end_offsets, marks)
        return Plan(
            **head,
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
                *replayed,
            ],
        )
    target = replay_from_origin(layout, marks, "rebuild --from-source")
    return Plan(
        **head,
        target_offsets=target,
        seed_state_version=None,
        state_action=StateAction.EMPTY,
        records_to_replay=sum(current.get(tp, off) - off for tp, off in target.items()),
        notes=[
            "recomputes from the application's first offsets; the published state is "
            "empty until the replay has caught up",
            *replayed,
        ],
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
    check_listed(pipeline, settings, layout, last, marks, topics)
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
    ledger_now = current_ledger(layout)
    if ledger_now is None:
        return []
    history = current_log_history(layout, ledger_now)
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
