"""Reviewed plans: a dry run saves its plan; ``--plan <id>`` applies exactly it.

Kafka's reset tool takes a plan from a file and Terraform applies a saved plan;
here the saved plan also records where the application stood when it was made
(epoch, last committed batch, pipeline version, state table version). Applying
it refuses, in one line saying what changed, when any of these moved since: the
offsets and versions in it would no longer be what was reviewed (maintenance
commits to the state table change no row and do not count). Plans live in
``<warehouse>/<application>/_plans/<id>.json``.

A plan is created put-if-absent (``Location.create``) and never replaced: every
attempt of an Airflow run saves under the run's id, and a paused first attempt
that wakes must not replace the plan a person approved (a later attempt keeps the
plan the first saved, and prints that one). Its digest (the SHA-256
of the stored bytes) is shown for review and, given at apply (``--plan-digest``),
checked against what is loaded.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import time
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow.dataset as ds
from deltalake import DeltaTable

from jobs.audit import append_audit, audit_row, who
from jobs.cut import loadable
from jobs.delta.layout import AppLayout
from jobs.errors import ConfigError, ConsistencyError
from jobs.ledger import (
    DONE,
    IS_BATCH,
    MAINTAIN,
    STARTED,
    beyond_horizon,
    current_epoch,
    last_batch,
    read_ledger,
    unfinished_epochs,
)
from jobs.operations.plan import Plan
from jobs.output.changes import commit_infos
from jobs.pipeline.model import Pipeline
from jobs.warehouse import AlreadyExistsError, Location

PLAN_ID = re.compile(r"^\d{8}T\d{6}Z-[0-9a-f]{8}$")
# A plan's SHA-256, whole or its first 12 hex digits or more (what a reviewer copies).
DIGEST = re.compile(r"[0-9a-f]{12,64}")


@dataclass(frozen=True)
class Position:
    """Where an application stands: what a plan was computed from."""

    epoch: int
    last_batch: tuple[int, int] | None  # (epoch, batch id) of the last committed batch
    pipeline_version: int
    state_version: int

    def changes_since(self, before: Position) -> list[str]:
        found = []
        if self.epoch != before.epoch:
            found.append(f"the epoch moved from {before.epoch} to {self.epoch}")
        if self.last_batch != before.last_batch:
            found.append(
                f"the last committed batch was {_batch(before.last_batch)}, now "
                f"{_batch(self.last_batch)}"
            )
        if self.pipeline_version != before.pipeline_version:
            found.append(
                f"the pipeline version was {before.pipeline_version}, now {self.pipeline_version}"
            )
        return found


def _batch(batch: tuple[int, int] | None) -> str:
    return "none" if batch is None else f"epoch {batch[0]} batch {batch[1]}"


@dataclass(frozen=True)
class SavedPlan:
    plan_id: str
    plan: Plan
    position: Position
    created_at: str
    created_by: str
    extra: dict[str, Any]  # a backfill's preview
    digest: str  # SHA-256 of the stored file: what was reviewed


def position(layout: AppLayout, version: int) -> Position:
    last = last_batch(layout)
    state = layout.table("state")
    return Position(
        epoch=current_epoch(layout),
        last_batch=None if last is None else (int(last["epoch"]), int(last["batch_id"])),
        pipeline_version=version,
        state_version=DeltaTable(str(state)).version()
        if DeltaTable.is_deltatable(str(state))
        else -1,
    )


def plans_dir(layout: AppLayout) -> Location:
    return layout.root / "_plans"


def new_id(seed: str = "", moment: float | None = None) -> str:
    """A plan id: UTC time and 8 hex digits (of ``seed``: an Airflow run id makes
    the same id in every task of the run; else unique)."""
    when = time.gmtime(time.time() if moment is None else moment)
    digest = hashlib.sha256((seed or f"{time.time_ns()}{os.getpid()}").encode()).hexdigest()
    return time.strftime("%Y%m%dT%H%M%SZ", when) + "-" + digest[:8]


def check_id(plan_id: str) -> str:
    if not PLAN_ID.fullmatch(plan_id):
        raise ConfigError(f"a plan id looks like 20261123T101500Z-1a2b3c4d, got {plan_id!r}")
    return plan_id


def save(
    layout: AppLayout,
    pipeline: Pipeline,
    plan: Plan,
    extra: dict[str, Any] | None = None,
    plan_id: str | None = None,
) -> str:
    """Write the plan and the position it was made at; returns its id."""
    now = time.gmtime()
    plan_id = check_id(plan_id) if plan_id is not None else new_id()
    data = {
        "id": plan_id,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", now),
        "created_by": who(),
        "position": asdict(position(layout, pipeline.version)),
        "plan": {**plan.to_dict(), "plan_id": plan_id},
        "extra": extra or {},
    }
    text = json.dumps(data, indent=2, sort_keys=True, default=str)
    target = plans_dir(layout) / f"{plan_id}.json"
    try:
        target.create(text.encode())  # whole or absent, and never replaced
    except AlreadyExistsError:
        # A retried dry run (an Airflow attempt: every attempt of a run saves under its
        # id) keeps what the first saved, which is what a reviewer sees; anything but
        # the same operation of the same application under that id is refused.
        try:
            found = json.loads(target.read_bytes())
            kept = Plan.from_dict(found["plan"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"saved plan {target} is damaged: {exc}") from exc
        if (kept.operation, kept.application_id) != (plan.operation, plan.application_id):
            raise ConfigError(
                f"plan {plan_id} of {layout.application_id} is saved already and is a "
                f"{kept.operation} of {kept.application_id} (made {found.get('created_at', '?')} "
                f"by {found.get('created_by', '?')}): a saved plan is never replaced; save this "
                "one under a new id (a new DAG run, or --dry-run without --save-plan)"
            ) from None
    return plan_id


def check_digest(digest: str) -> str:
    if not DIGEST.fullmatch(digest):
        raise ConfigError(
            "a plan digest is the SHA-256 a dry run printed (12 to 64 lowercase hex digits), "
            f"got {digest!r}"
        )
    return digest


def load(layout: AppLayout, plan_id: str, operation: str, digest: str | None = None) -> SavedPlan:
    """The saved plan ``plan_id``; with ``digest`` (what was reviewed), only if the
    stored plan is exactly that one."""
    check_id(plan_id)
    if digest is not None:
        check_digest(digest)
    path = plans_dir(layout) / f"{plan_id}.json"
    try:
        stored = path.read_bytes()
    except FileNotFoundError:
        known = sorted(
            p.name.removesuffix(".json")
            for p in plans_dir(layout).iterdir()
            if p.name.endswith(".json") and not p.name.startswith(".")
        )[-5:]
        raise ConfigError(
            f"no saved plan {plan_id} for {layout.application_id} (newest: "
            f"{', '.join(known) or 'none'}); make one with --dry-run"
        ) from None
    found = hashlib.sha256(stored).hexdigest()
    if digest is not None and not found.startswith(digest):
        raise ConfigError(
            f"saved plan {plan_id} of {layout.application_id} has digest {found}, which is not "
            f"the plan that was reviewed ({digest}): nothing applied; review it again with "
            "--dry-run"
        )
    try:
        data = json.loads(stored)
        plan = Plan.from_dict(data["plan"])
        raw = data["position"]
        last = raw["last_batch"]
        saved_at = Position(
            epoch=int(raw["epoch"]),
            last_batch=None if last is None else (int(last[0]), int(last[1])),
            pipeline_version=int(raw["pipeline_version"]),
            state_version=int(raw["state_version"]),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"saved plan {path} is damaged: {exc}") from exc
    if plan.operation != operation or plan.application_id != layout.application_id:
        raise ConfigError(
            f"plan {plan_id} is a {plan.operation} of {plan.application_id}, not a {operation} "
            f"of {layout.application_id}"
        )
    return SavedPlan(
        plan_id,
        plan,
        saved_at,
        str(data.get("created_at", "")),
        str(data.get("created_by", "")),
        dict(data.get("extra") or {}),
        found,
    )


def own_attempts(layout: AppLayout, plan_id: str) -> list[int]:
    """The epochs this plan's earlier applies began and did not finish (each died
    after its fence; Airflow's retry of the task completes it), oldest first: the
    unfinished epochs, when every one of them is this plan's."""
    chain = unfinished_epochs(layout)
    if not chain:
        return []
    rows = read_ledger(layout, ["epoch", "details"], (ds.field("epoch") >= chain[0]) & ~IS_BATCH)
    ours = set()
    for row in [] if rows is None else rows.to_pylist():
        details = json.loads(row["details"] or "{}")
        if (
            details.get("phase") == STARTED
            and (details.get("plan") or {}).get("plan_id") == plan_id
        ):
            ours.add(int(row["epoch"]))
    return chain if set(chain) <= ours else []


def check_unmoved(layout: AppLayout, version: int, saved: SavedPlan) -> Plan:
    """Refuse a plan the application has moved away from since it was made: a new
    batch, epoch or pipeline version, a data change to ``state`` (maintenance's
    compaction is none), or a state version it restores that maintain removed.
    The plan's own applies that died after their fence are no move: the plan is
    returned to start from the newest of them (``apply_plan`` undoes what they
    wrote), else as it was saved."""
    now = position(layout, version)
    attempts = own_attempts(layout, saved.plan_id)
    if attempts and attempts[0] == saved.position.epoch + 1 and attempts[-1] == now.epoch:
        now = dataclasses.replace(now, epoch=saved.position.epoch)
    else:
        attempts = []
    changes = now.changes_since(saved.position)
    if not changes:
        changes = state_changes(
            layout, saved.position.state_version, now.state_version, {str(e) for e in attempts}
        )
    restores = [
        v
        for v in (
            saved.plan.seed_state_version,
            None if saved.plan.boundary is None else saved.plan.boundary.state_version,
        )
        if v is not None
    ]
    floor = saved.plan.boundary is not None and saved.plan.boundary.floor
    kept = beyond_horizon(layout, min(restores)) if restores else None
    if kept is not None and floor and loadable(layout.table("state"), min(restores)):
        kept = None  # maintain keeps a recreated topic's repair state whatever its age
    if kept is not None:
        changes.append(
            f"maintain removed the files of state version {min(restores)}, which it restores "
            f"(kept from version {kept})"
        )
    if changes:
        raise ConfigError(
            f"plan {saved.plan_id} (made {saved.created_at} by {saved.created_by}) no longer "
            f"fits {saved.plan.application_id}: {'; '.join(changes)}; make a new plan with "
            "--dry-run and review it"
        )
    if not attempts:
        return saved.plan
    return dataclasses.replace(saved.plan, epoch_before=attempts[-1], epoch_after=attempts[-1] + 1)


def state_changes(
    layout: AppLayout, before: int, now: int, own_epochs: set[str] | None = None
) -> list[str]:
    """How ``state`` changed between two versions, leaving out maintenance commits
    (compaction and vacuum change no row: a plan waiting for review survives them)
    and those of ``own_epochs`` (the plan's own dead applies)."""
    if now == before:
        return []
    moved = f"the state table moved from version {before} to {now}"
    if now < before:
        return [f"{moved} (it was replaced)"]
    try:
        infos = commit_infos(layout.table("state"), before + 1, now)
    except ConsistencyError:
        return [f"{moved} (its log no longer holds the versions between)"]
    data = [
        v
        for v, info in sorted(infos.items())
        if info.get("platform_operation") != MAINTAIN
        and str(info.get("epoch")) not in (own_epochs or set())
    ]
    if not data:
        return []
    return [f"{moved} (version {data[0]} was a {operation_of(infos[data[0]])})"]


def operation_of(info: dict[str, Any]) -> str:
    return str(info.get("platform_operation") or info.get("operation") or "commit")


def applied_at(layout: AppLayout, plan_id: str) -> str | None:
    """When the plan was applied (its operation's "done" ledger row), if it was."""
    rows = read_ledger(layout, ["epoch", "commit_time", "details"], ~IS_BATCH)
    for row in [] if rows is None else rows.to_pylist():
        details = json.loads(row["details"] or "{}")
        if details.get("phase") != DONE or details.get("dry_run"):
            continue
        if (details.get("plan") or {}).get("plan_id") == plan_id:
            return f"{row['commit_time']} (epoch {row['epoch']})"
    return None


def record_rejection(
    layout: AppLayout, pipeline: Pipeline, plan_id: str, operation: str, by: str
) -> None:
    """A reviewer rejected the plan: nothing was applied; the ledger says so."""
    reviewed = load(layout, plan_id, operation)
    append_audit(
        layout,
        audit_row(
            pipeline,
            operation,
            current_epoch(layout),
            {
                "reason": reviewed.plan.reason,
                "plan_id": plan_id,
                "decision": "rejected",
                "rejected_by": by,
                "dry_run": True,  # nothing applied: not an operation in progress
            },
        ),
    )


def record_dry_run(
    layout: AppLayout,
    pipeline: Pipeline,
    plan: Plan,
    extra: dict[str, Any] | None,
    save_as: str | None,
) -> None:
    """A dry run: the plan saved (with what a preview adds, ``extra``) under its id
    (``plan.plan_id``) and audited in the ledger; nothing else changes."""
    plan.plan_id = save(layout, pipeline, plan, extra, save_as)
    details, *offsets = plan.audit(dry_run=True)
    append_audit(layout, audit_row(pipeline, plan.operation, plan.epoch_before, details, *offsets))
