"""Carrying out a plan (the caller holds the application lock): plan (pure, done)
-> the cut -> its audit row.

Everything the cut needs is read and checked before anything is written: the
state's shape where the plan seeds from it, the seed rows, the topics' ids. The
cut then goes through ``jobs.cut.apply_cut`` in one call (seed, cut file, the
fence of every table, orphan removal, the state action); the operation's two
audit rows frame it (the bump commit on the ledger is the first: fenced and
recorded at once), and Kafka's lag tools see the new epoch's start.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from jobs import kafka_admin, monitoring_group
from jobs.audit import append_audit, audit_row
from jobs.cut import (
    Cut,
    StateAction,
    StateChange,
    apply_cut,
    check_state_shape,
    latest_cut,
    read_cut,
    recorded_definition,
)
from jobs.delta.layout import AppLayout
from jobs.errors import ConfigError
from jobs.ledger import current_epoch, current_ledger, unfinished_epochs
from jobs.operations.plan import Plan
from jobs.pipeline.model import Pipeline
from jobs.settings import Settings
from jobs.state_seed import seed_at


def apply_plan(
    pipeline: Pipeline,
    settings: Settings,
    plan: Plan,
    seed_override: pa.Table | None = None,
    publish: Callable[[], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Carry out ``plan``. ``seed_override``: a backfill's recomputed state, seeded
    instead of a state version; ``publish``: its commit of that state (PUBLISH)."""
    layout = AppLayout(settings.warehouse, pipeline.application_id)
    if current_epoch(layout) != plan.epoch_before:
        raise ConfigError("the application moved to another epoch since the plan was made")
    new, reason = plan.epoch_after, plan.reason
    previous = read_cut(layout, plan.epoch_before)
    kept = {} if previous is None else dict(previous.topic_ids)
    kept = {t: i for t, i in kept.items() if t not in plan.reset_topics}
    # What is beyond the ledger is judged by apply_cut, once every table is fenced.
    state = StateChange(plan.state_action, plan.restore_version, publish=publish)
    unfinished, floor = unfinished_epochs(layout), watermark_floor(layout, plan)
    details, *offsets = plan.audit(dry_run=False)
    # What the cut needs, read and checked: nothing is written before it.
    if plan.state_action is not StateAction.PUBLISH:  # a backfill checked before recomputing
        check_seed_shape(layout, pipeline, plan)
    audit = audit_row(pipeline, plan.operation, new, {**details, "phase": "started"}, *offsets)
    seed = seed_at(layout.table("state"), pipeline, plan.seed_state_version, seed_override)
    config = kafka_admin.client_config(settings.bootstrap_servers, settings.kafka_client)
    topic_ids = kafka_admin.topic_ids(kafka_admin.admin(config), pipeline.topics)
    cut = Cut(
        epoch=new,
        starting_offsets=offsets[1],
        origin=plan.operation,
        seed_rows=None if seed is None else seed.num_rows,
        watermark_ms=floor,
        topic_ids=topic_ids,
        state_shape=pipeline.state_shape,
        definition=recorded_definition(pipeline),
    )
    result = apply_cut(layout, pipeline, cut, kept, reason, audit, seed, unfinished, state)
    done = {**details, "phase": "done", "result": result}
    append_audit(layout, audit_row(pipeline, plan.operation, new, done, *offsets), fenced=True)
    # Kafka's own tools show the application's lag from where the new epoch starts.
    monitoring_group.commit_once(config, pipeline.application_id, cut.starting_offsets)
    return result


def check_seed_shape(layout: AppLayout, pipeline: Pipeline, plan: Plan) -> None:
    """A plan seeded from the published state at a boundary needs that state to
    have the pipeline's shape: the shape of the cut the boundary's epoch began with."""
    if plan.seed_state_version is None:
        return
    epoch = plan.epoch_before if plan.boundary is None else plan.boundary.epoch
    cut = latest_cut(layout, epoch)
    if cut is not None:
        check_state_shape(layout, pipeline, cut, new_checkpoint=True)


def watermark_floor(layout: AppLayout, plan: Plan) -> int:
    """The watermark below which the new epoch treats windows as closed: where the
    state it starts from stands. Emptied state reopens everything; a backfill's
    published state has judged every record the stream read, with the stream's
    watermarks, so it continues from the highest one."""
    if plan.state_action is StateAction.PUBLISH:
        ledger_now = current_ledger(layout)
        return 0 if ledger_now is None else ledger_now.history().head.watermark_ms
    if plan.state_action is StateAction.EMPTY or plan.boundary is None:
        return 0
    return plan.boundary.watermark_ms
