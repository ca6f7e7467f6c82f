"""Running an operation from the command line or Airflow: plan, print, audit, and
(without ``--dry-run``) fence the stream, take the application, apply."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from jobs import kafka_admin, resolution
from jobs.audit import audit_row
from jobs.cut import check_against_current_cut, fenced_tables
from jobs.delta import layout as tables
from jobs.delta.layout import AppLayout
from jobs.delta.writer import bump_epoch
from jobs.errors import ConfigError, LockedError, PlatformError
from jobs.ledger import current_epoch
from jobs.lock import application_lock, describe, holder
from jobs.operations import saved_plans
from jobs.operations.apply import apply_plan
from jobs.operations.plan import Plan
from jobs.operations.restart import plan_rebuild
from jobs.output.publisher import OutputPublisher
from jobs.pipeline.model import Pipeline
from jobs.resolution import Resolved
from jobs.settings import Settings
from jobs.superseded import remove_superseded_dead_letters

# How long an operation waits for the stream it fenced to exit: it sees the fence at its
# next commit, or within seconds when idle; a batch in flight finishes (or fails) first.
FENCE_WAIT_S = 300.0


def check_reason(reason: str) -> str:
    reason = reason.strip()
    if not reason or len(reason) > 500:
        raise ConfigError("--reason must be 1-500 characters: say why, it goes into the ledger")
    return reason


def dry_run_operation(
    pipeline: Pipeline,
    settings: Settings,
    make_plan: Callable[[], Plan],
    echo: Callable[[str], None] = print,
    inspect: Callable[[Plan], dict[str, Any] | None] | None = None,
    save_as: str | None = None,
) -> Plan:
    """Plan (pure) -> print -> save and audit it: nothing else changes.

    ``inspect`` adds to it (a backfill's preview, saved with the plan). The plan is
    saved (``saved_plans.py``) under ``save_as`` (the id an Airflow run chooses) or
    a new id, which it prints: ``run_operation(plan_id=...)`` applies exactly it."""
    layout = AppLayout(settings.warehouse, pipeline.application_id)
    resolved = resolution.load_stored(layout, pipeline)
    check_against_current_cut(layout, pipeline, shape=False)
    plan = make_plan()
    echo(plan.describe())
    # The tables first: the position saved must be the one an apply will see.
    tables.ensure_tables(layout, resolved, plan.republishes)
    extra = inspect(plan) if inspect is not None else None
    saved_plans.record_dry_run(layout, pipeline, plan, extra, save_as)
    assert plan.plan_id is not None
    saved = saved_plans.load(layout, plan.plan_id, plan.operation)
    if saved.plan != plan:  # a retried dry run: the first attempt's plan is kept
        echo(f"plan {plan.plan_id} was saved already; it is kept:\n{saved.plan.describe()}")
    digest = saved.digest
    echo(f"plan: {plan.plan_id}")
    echo(f"plan digest: {digest}")
    echo(
        "dry run: nothing was changed (the plan is recorded in the ledger); apply exactly "
        f"it with --plan {plan.plan_id} --plan-digest {digest}"
    )
    return plan


def run_operation(
    pipeline: Pipeline,
    settings: Settings,
    make_plan: Callable[[], Plan],
    echo: Callable[[str], None] = print,
    apply: Callable[[Plan], dict[str, Any]] | None = None,
    plan_id: str | None = None,
    operation: str = "",
    plan_digest: str | None = None,
) -> Plan:
    """Plan (pure) -> print -> fence a running stream, take the application, apply
    the cut -> publish the corrections.

    ``apply`` replaces the plain apply (a backfill publishes before it restarts).
    ``plan_id`` applies exactly a plan a dry run saved (``dry_run_operation``), or
    refuses when the application moved since; ``plan_digest`` (what was reviewed)
    refuses any other plan saved under that id."""
    layout = AppLayout(settings.warehouse, pipeline.application_id)
    reviewed = (
        None if plan_id is None else saved_plans.load(layout, plan_id, operation, plan_digest)
    )
    applied = reviewed is not None and _already_applied(layout, reviewed, echo)
    busy = holder(layout)
    if applied and busy is not None and reviewed is not None:
        return reviewed.plan  # the running stream publishes what that attempt left
    _refuse_busy(pipeline, busy, reviewed)
    resolved = resolution.load_stored(layout, pipeline)
    check_against_current_cut(layout, pipeline, shape=False)  # a saved plan's cut records it
    plan = make_plan() if reviewed is None else reviewed.plan
    if not applied:
        echo(plan.describe() if reviewed is None else _reviewed_header(reviewed))
    if busy is not None:  # a stream: fenced now (it cannot commit after this)
        tables.ensure_tables(layout, resolved, plan.republishes)
        fence_running_stream(pipeline, layout, plan, busy, echo)
    purpose = f"--plan {plan_id}" if reviewed is not None else f"--reason {plan.reason!r}"
    with application_lock(layout, f"{plan.operation} {purpose}"):
        if applied:  # that attempt may have died before it published
            publish_corrections(resolved, layout, settings, echo)
            return plan
        fence_epoch = current_epoch(layout)
        try:
            if reviewed is not None:
                plan = saved_plans.check_unmoved(layout, pipeline.version, reviewed)
            else:  # again: the stream may have committed more before the fence
                plan = make_plan()
                echo(f"plan under the lock:\n{plan.describe()}")
            tables.ensure_tables(layout, resolved, plan.republishes)
            result = apply(plan) if apply is not None else apply_plan(pipeline, settings, plan)
        except PlatformError as refused:
            # Refused before the operation's own epoch began (its plan, or a check
            # before its bump): nothing of it was applied, but the stream is fenced.
            if busy is None or current_epoch(layout) != fence_epoch:
                raise
            raise resume_unchanged(pipeline, settings, plan.operation, refused, echo) from refused
        echo(f"applied: {result}; epoch {plan.epoch_before} -> {plan.epoch_after}")
        supersede_dead_letters(layout, echo)
        publish_corrections(resolved, layout, settings, echo)
    echo(f"next: python -m jobs run --pipeline {pipeline.application_id} resumes from the cut")
    return plan


def _refuse_busy(
    pipeline: Pipeline, busy: dict[str, object] | None, reviewed: saved_plans.SavedPlan | None
) -> None:
    """Another operation holds the application: refused. A stream is fenced instead,
    but not for a reviewed plan (that would move the application away from it)."""
    if busy is None:
        return
    if reviewed is not None:
        raise LockedError(
            f"application {pipeline.application_id} is busy: held by {describe(busy)}; a "
            "saved plan applies to a stopped application (stop the stream, or apply without "
            "--plan, which fences it and plans again)"
        )
    if not str(busy.get("purpose", "")).startswith("run"):
        raise LockedError(
            f"application {pipeline.application_id} is busy: held by {describe(busy)}"
        )


def _already_applied(
    layout: AppLayout, reviewed: saved_plans.SavedPlan, echo: Callable[[str], None]
) -> bool:
    """A retry after the apply (Airflow's, say): nothing to do."""
    when = saved_plans.applied_at(layout, reviewed.plan_id)
    if when is not None:
        echo(f"plan {reviewed.plan_id} was already applied at {when}: nothing to do")
    return when is not None


def _reviewed_header(reviewed: saved_plans.SavedPlan) -> str:
    """The reviewed plan, as it was saved: never recomputed."""
    return (
        f"applying plan {reviewed.plan_id} (made {reviewed.created_at} by "
        f"{reviewed.created_by}):\n{reviewed.plan.describe()}"
    )


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
    resolved: Resolved, layout: AppLayout, settings: Settings, echo: Callable[[str], None]
) -> None:
    """The operation's state changes to the output topic, as corrections. They are
    applied already: if the topic cannot take them now, the next run publishes them
    (nothing is lost; the reason is printed)."""
    output_topic = resolved.pipeline.output
    if output_topic is None:
        return
    config = kafka_admin.client_config(settings.bootstrap_servers, settings.kafka_client)
    try:
        with OutputPublisher(resolved, layout, config) as output:
            done = output.publish_pending()
    except Exception as exc:  # applied already: the operation must not look failed
        echo(f"output: not published yet ({exc}); the next run publishes it")
        return
    records = sum(p.records for p in done)
    echo(
        f"output: {records} record(s) of {len(done)} state version(s) published to "
        f"{output_topic.topic}"
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
    paths = fenced_tables(layout, pipeline)
    row = audit_row(pipeline, "fence", epoch + 1, {"reason": plan.reason, "for": plan.operation})
    bump_epoch(paths, pipeline.application_id, epoch + 1, plan.reason, first_rows=row)
    deadline = time.monotonic() + FENCE_WAIT_S
    while holder(layout) is not None:
        if time.monotonic() > deadline:
            raise LockedError(
                f"the fenced stream of {pipeline.application_id} did not exit within "
                f"{FENCE_WAIT_S:.0f} s; it can no longer commit; stop it and run this again"
            )
        time.sleep(0.5)
