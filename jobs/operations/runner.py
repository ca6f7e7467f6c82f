"""Running an operation from the command line or Airflow: plan, print, audit, and
(without ``--dry-run``) fence the stream, take the application, apply."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from jobs import kafka_admin
from jobs import resolved as resolution
from jobs.audit import audit_row
from jobs.cut import check_definition, fenced_tables, latest_cut
from jobs.delta import layout as tables
from jobs.delta.layout import AppLayout
from jobs.delta.writer import bump_epoch
from jobs.errors import ConfigError, PlatformError
from jobs.ledger import current_epoch
from jobs.lock import LockedError, application_lock, describe, holder
from jobs.operations import saved
from jobs.operations.plan import Plan
from jobs.operations.restart import apply_plan, audit_dry_run, plan_rebuild
from jobs.output.publisher import OutputPublisher
from jobs.pipeline import Pipeline
from jobs.settings import Settings
from jobs.superseded import remove_superseded_dead_letters

FENCE_WAIT_S = 120.0


def check_reason(reason: str) -> str:
    reason = reason.strip()
    if not reason or len(reason) > 500:
        raise ConfigError("--reason must be 1-500 characters: say why, it goes into the ledger")
    return reason


def run_operation(
    pipeline: Pipeline,
    settings: Settings,
    make_plan: Callable[[], Plan],
    dry_run: bool,
    echo: Callable[[str], None] = print,
    apply: Callable[[Plan], dict[str, Any]] | None = None,
    inspect: Callable[[Plan], dict[str, Any] | None] | None = None,
    plan_id: str | None = None,
    operation: str = "",
    save_as: str | None = None,
) -> Plan:
    """``inspect`` adds to a dry run (a backfill's preview, saved with the plan);
    ``apply`` replaces the plain restart (a backfill publishes before it restarts).
    A dry run saves its plan (``saved.py``) and prints its id; ``plan_id`` applies
    exactly that plan, or refuses when the application moved since (``save_as``:
    the id to save it under, as an Airflow run chooses it)."""
    layout = AppLayout(settings.warehouse, pipeline.application_id)
    cut = latest_cut(layout, current_epoch(layout))
    if cut is not None:  # a saved plan too: the cut it writes records the definition
        check_definition(layout, pipeline, cut)
    if plan_id is not None:
        if dry_run:
            raise ConfigError("--plan applies a saved plan: leave out --dry-run/--preview")
        return _apply_saved(
            pipeline, settings, layout, saved.load(layout, plan_id, operation), echo, apply
        )
    busy = None if dry_run else holder(layout)
    if busy is not None and not str(busy.get("purpose", "")).startswith("run"):
        # Another operation: refuse. A stream is fenced instead (below).
        raise LockedError(
            f"application {pipeline.application_id} is busy: held by {describe(busy)}"
        )
    plan = make_plan()
    echo(plan.describe())
    if dry_run:
        extra = inspect(plan) if inspect is not None else None
        # The tables first: the position saved must be the one an apply will see.
        tables.ensure_tables(layout, resolution.load(layout, pipeline), plan.republishes)
        saved_id = saved.save(layout, pipeline, plan, extra, save_as)
        plan.plan_id = saved_id
        audit_dry_run(pipeline, settings, plan)
        echo(f"plan: {saved_id}")
        echo(
            "dry run: nothing was changed (the plan is recorded in the ledger); apply exactly "
            f"it with --plan {saved_id}"
        )
        return plan
    if busy is not None:
        fence_running_stream(pipeline, layout, plan, busy, echo)
    with application_lock(layout, f"{plan.operation} --reason {plan.reason!r}"):
        fence_epoch = current_epoch(layout)
        try:
            plan = make_plan()  # again: the stream may have committed more before the fence
            echo(f"plan under the lock:\n{plan.describe()}")
            result = apply(plan) if apply is not None else apply_plan(pipeline, settings, plan)
        except PlatformError as refused:
            # Refused before the operation's own epoch began (its plan, or a check
            # before its bump): nothing of it was applied, but the stream is fenced.
            if busy is None or current_epoch(layout) != fence_epoch:
                raise
            raise resume_unchanged(pipeline, settings, plan.operation, refused, echo) from refused
        echo(f"applied: {result}; epoch {plan.epoch_before} -> {plan.epoch_after}")
        supersede_dead_letters(layout, echo)
        publish_corrections(pipeline, settings, echo)
    echo(f"next: python -m jobs run --pipeline {pipeline.application_id} resumes from the cut")
    return plan


def _apply_saved(
    pipeline: Pipeline,
    settings: Settings,
    layout: AppLayout,
    reviewed: saved.SavedPlan,
    echo: Callable[[str], None],
    apply: Callable[[Plan], dict[str, Any]] | None,
) -> Plan:
    """The reviewed plan, as it was saved: never recomputed. A running stream is
    not fenced for it (that would move the application away from the plan)."""
    plan_id = reviewed.plan_id
    plan = reviewed.plan
    when = saved.applied_at(layout, plan_id)
    if when is not None:  # a retry after the apply (Airflow's, say): nothing to do
        echo(f"plan {plan_id} was already applied at {when}: nothing to do")
        if holder(layout) is None:  # (a running stream publishes what is pending itself)
            with application_lock(layout, f"{plan.operation} --plan {plan_id}"):
                publish_corrections(pipeline, settings, echo)  # in case that attempt died
        return plan
    busy = holder(layout)
    if busy is not None:
        raise LockedError(
            f"application {pipeline.application_id} is busy: held by {describe(busy)}; a "
            "saved plan applies to a stopped application (stop the stream, or apply without "
            "--plan, which fences it and plans again)"
        )
    echo(f"applying plan {plan_id} (made {reviewed.created_at} by {reviewed.created_by}):")
    echo(plan.describe())
    with application_lock(layout, f"{plan.operation} --plan {plan_id}"):
        plan = saved.check_unmoved(layout, pipeline, reviewed)
        result = apply(plan) if apply is not None else apply_plan(pipeline, settings, plan)
        echo(f"applied: {result}; epoch {plan.epoch_before} -> {plan.epoch_after}")
        supersede_dead_letters(layout, echo)
        publish_corrections(pipeline, settings, echo)
    echo(f"next: python -m jobs run --pipeline {pipeline.application_id} resumes from the cut")
    return plan


def supersede_dead_letters(layout: AppLayout, echo: Callable[[str], None]) -> None:
    """The dead letters the operation judged again go (``jobs/superseded.py``). It
    is applied already: if that fails now, the next run's start completes it."""
    try:
        removed = remove_superseded_dead_letters(layout)
    except Exception as exc:  # applied already: the operation must not look failed
        echo(f"dead letters: not superseded yet ({exc}); the next run completes it")
        return
    if removed:
        echo(f"dead letters: {removed} judged again by the operation removed")


def publish_corrections(
    pipeline: Pipeline, settings: Settings, echo: Callable[[str], None]
) -> None:
    """The operation's state changes to the output topic, as corrections. They are
    applied already: if the topic cannot take them now, the next run publishes them
    (nothing is lost; the reason is printed)."""
    if pipeline.output is None:
        return
    layout = AppLayout(settings.warehouse, pipeline.application_id)
    config = kafka_admin.client_config(settings.bootstrap_servers, settings.kafka_client)
    try:
        with OutputPublisher(resolution.load(layout, pipeline), layout, config) as output:
            done = output.publish_pending()
    except Exception as exc:  # applied already: the operation must not look failed
        echo(f"output: not published yet ({exc}); the next run publishes it")
        return
    records = sum(p.records for p in done)
    echo(
        f"output: {records} record(s) of {len(done)} state version(s) published to "
        f"{pipeline.output.topic}"
    )


def resume_unchanged(
    pipeline: Pipeline,
    settings: Settings,
    operation: str,
    refused: PlatformError,
    echo: Callable[[str], None],
) -> PlatformError:
    """An operation refused after it fenced the running stream (the stream committed
    more meanwhile, and the plan no longer holds): the fence epoch is completed as
    a rebuild that keeps the state as the ledger has it, so ``run`` resumes the
    application unchanged. Returns the error to raise: the operation was refused."""
    reason = f"resume after a refused {operation}: {refused}"[:500]
    try:
        plan = plan_rebuild(pipeline, settings, reason, from_source=False)
        result = apply_plan(pipeline, settings, plan)
    except PlatformError as cannot:  # the state's shape no longer fits a seed, say
        return ConfigError(
            f"{refused}; the stream was fenced before this was known, and it cannot "
            f"resume unchanged ({cannot}); complete the fence with python -m jobs rebuild "
            f"--pipeline {pipeline.application_id} --from-source --reason '...'"
        )
    echo(f"resumed unchanged: {result}; epoch {plan.epoch_before} -> {plan.epoch_after}")
    return ConfigError(
        f"{refused}; nothing was changed: the fenced stream resumes from epoch "
        f"{plan.epoch_after} with its state as the ledger has it (python -m jobs run "
        f"--pipeline {pipeline.application_id})"
    )


def fence_running_stream(
    pipeline: Pipeline,
    layout: AppLayout,
    plan: Plan,
    busy: dict[str, object],
    echo: Callable[[str], None],
) -> None:
    """Bump the epoch now (the stream cannot commit after this), then wait for it to exit.

    The fence epoch never runs: it has no cut. The operation then plans from the
    stream's last commit and starts the epoch after it."""
    epoch = current_epoch(layout)
    echo(f"fencing the running stream ({describe(busy)}) at epoch {epoch + 1}")
    tables.ensure_tables(layout, resolution.load(layout, pipeline), plan.republishes)
    bump_epoch(
        fenced_tables(layout, pipeline),
        pipeline.application_id,
        epoch + 1,
        plan.reason,
        first_rows=audit_row(
            pipeline, "fence", epoch + 1, {"reason": plan.reason, "for": plan.operation}
        ),
    )
    deadline = time.monotonic() + FENCE_WAIT_S
    while holder(layout) is not None:
        if time.monotonic() > deadline:
            raise LockedError(
                f"the fenced stream of {pipeline.application_id} did not exit within "
                f"{FENCE_WAIT_S:.0f} s; it can no longer commit; stop it and run this again"
            )
        time.sleep(0.5)
