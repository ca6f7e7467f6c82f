"""``maintain``: keep an application's tables and folders bounded without taking
away a state version a rewind may still target.

The promise, from the pipeline's ``maintenance.rewind_horizon``: every batch
boundary committed within the horizon, and the last one before it (so a rewind
``--by-duration`` of the horizon finds its boundary), stays a rewind target. Its
state version stays loadable: vacuum keeps files removed less than
``retention_hours`` ago (whole hours, as Delta counts them) and, for the part of
the horizon those hours do not cover, the files of every boundary's version.
The oldest kept version goes into the ledger before anything is removed, and the
planners refuse an older boundary from then on.

Steps per table: compact small files, vacuum (which also removes data files moved
in for a commit that a crash cut off), then checkpoint the log and drop its entries
below the oldest version that must stay loadable (``jobs/delta/log.py``). Then old
epochs' Spark checkpoints and seeds, and staged data files of batches that can no
longer commit, are deleted.
``maintain`` runs next to a live stream without its lock (Delta's optimistic
commits order the two; a conflict is retried), and refuses to run next to an
operation; its refusals are made when it plans and again when it applies
(``refuse_to_maintain``).
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from deltalake import CommitProperties, DeltaTable
from deltalake.exceptions import CommitFailedError

from jobs import kafka_admin
from jobs.audit import append_audit, audit_row
from jobs.cut import live_boundaries, log_floor
from jobs.delta import layout as tables
from jobs.delta.files import stale_staged_files
from jobs.delta.layout import AppLayout
from jobs.delta.log import (
    TABLE_CONFIGURATION,
    entry_times,
    keep_loadable_from,
    log_entries,
    removal_stamps,
)
from jobs.delta.writer import MAX_ATTEMPTS, OperationFence, check_hold, committed_batch
from jobs.errors import ConsistencyError, LockedError, OutputError, PlatformError
from jobs.ledger import (
    DONE,
    MAINTAIN,
    STARTED,
    current_epoch,
    unfinished_operation,
)
from jobs.lineage import Boundary
from jobs.lock import describe, holder
from jobs.output.publisher import read_bookmark, versions_needed
from jobs.pipeline.model import Pipeline
from jobs.settings import Settings
from jobs.warehouse import Location

log = logging.getLogger(__name__)
HOUR_US = 3_600_000_000
# Boundaries up to this long after the retention cutoff keep their files too: the
# vacuum reads its clock a moment after its retention is set (``vacuum_retention_hours``).
PLAN_MARGIN_US = 10 * 60 * 1_000_000


@dataclass(frozen=True)
class MaintenancePlan:
    application_id: str
    epoch: int
    reason: str
    planned_at_us: int
    horizon_s: int
    kept: Boundary | None  # the oldest boundary a rewind may still target
    retention_hours: int  # vacuum keeps files removed more recently than this
    keep_versions: tuple[int, ...]  # state versions kept beyond the retention
    table_files: dict[str, tuple[int, int]]  # name -> (live files, parquet files on disk)
    reader_grace_hours: int  # nothing younger is deleted: a reader may have listed it
    stale: tuple[str, ...] = field(default=())  # old epochs' folders (and legacy staging)
    # The first state version the output topic still has to read (None: no output),
    # and the vacuum retention of ``state`` that keeps its files (and change files,
    # which no snapshot lists) while it is unpublished.
    output_from: int | None = None
    output_retention_hours: int = 0
    # The state a recreated topic's repair kept (``cut.log_floor``): what every
    # recomputation from the first offsets starts from, kept whatever its age.
    floor_version: int | None = None
    # When the plan was made, on this machine's clock (what the vacuum's cutoff
    # moves on with: ``vacuum_retention_hours``).
    planned_local_us: int = field(default_factory=lambda: int(time.time() * 1_000_000))

    def describe(self) -> str:
        kept = (
            "none yet (no batch committed)"
            if self.kept is None
            else f"epoch {self.kept.epoch} batch {self.kept.batch_id}, committed "
            f"{_utc(self.kept.commit_time_us)}, state version {self.kept.state_version}"
        )
        lines = [
            f"maintain {self.application_id} (epoch {self.epoch}): {self.reason}",
            f"  rewind horizon: {self.horizon_s} s; oldest boundary kept as a target: {kept}",
            f"  vacuum: files removed more than {self.retention_hours} h ago, except those of "
            f"{len(self.keep_versions)} boundary version(s) inside the horizon",
        ]
        for name, (live, on_disk) in self.table_files.items():
            lines.append(
                f"  {name:<12} {live:>6} live file(s), {on_disk:>6} on disk: compact, vacuum"
            )
        floor = (
            "the current version"
            if self.kept is None
            else (
                f"state version {self.kept.state_version} for state, the current one for the others"
            )
        )
        lines.append(
            f"  log: checkpoint, then drop entries below {floor} (older than "
            f"{self.reader_grace_hours} h)"
        )
        if self.output_from is not None:
            lines.append(
                f"  output: state versions from {self.output_from} are not all in the topic "
                f"yet; they stay loadable (state vacuum keeps {self.output_retention_hours} h)"
            )
        lines.append(f"  delete {len(self.stale)} old epoch folder(s)")
        lines += [f"    {path}" for path in self.stale[:20]]
        if len(self.stale) > 20:
            lines.append(f"    ... and {len(self.stale) - 20} more")
        return "\n".join(lines)

    def details(self) -> dict[str, Any]:
        return {
            "reason": self.reason,
            "horizon_s": self.horizon_s,
            "kept_state_version": None if self.kept is None else self.kept.state_version,
            "kept_boundary": None
            if self.kept is None
            else {"epoch": self.kept.epoch, "batch_id": self.kept.batch_id},
            "retention_hours": self.retention_hours,
            "keep_versions": len(self.keep_versions),
            "stale_paths": len(self.stale),
            "output_from": self.output_from,
            "floor_version": self.floor_version,
        }


def _utc(micros: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(micros / 1_000_000))


def files_on_disk(path: Location) -> int:
    """The table's data files in storage (not its log's or staged ones)."""
    inside = len(path.uri) + 1
    return sum(
        1
        for p in path.all_files()
        if p.name.endswith(".parquet")
        and not {"_delta_log", "_staging"} & set(p.uri[inside:].split("/"))
    )


def plan_maintenance(pipeline: Pipeline, settings: Settings, reason: str) -> MaintenancePlan:
    """What ``maintain`` would keep and remove now. It changes nothing; the one object
    it may write is the cache of what it read of the log (``removal_stamps``: facts
    of immutable entries, so a dry run may write it too).

    One clock per decision. Ages (the rewind horizon, the reader grace) are the
    store's: when it received each log entry, against its time now. The vacuum's
    retention is then put in the frame Delta's vacuum compares: the stamps the
    entries' writers put on them against this machine's clock. No decision sets
    a time one machine wrote against another machine's clock."""
    layout = AppLayout(settings.warehouse, pipeline.application_id)
    refuse_to_maintain(pipeline, layout)
    store_now = int(layout.root.store_time() * 1_000_000)
    local_now = int(time.time() * 1_000_000)
    state = layout.table("state")
    listed = log_entries(state)
    received = {v: int(s * 1_000_000) for v, s in entry_times(state, listed).items()}
    boundaries = [  # dated by the store; an entry already dropped: older than any
        dataclasses.replace(b, commit_time_us=received.get(b.state_version, 0))
        for b in live_boundaries(layout)
    ]
    kept = oldest_kept(boundaries, store_now - pipeline.rewind_horizon_seconds * 1_000_000)
    try:
        floor = log_floor(layout)
    except ConsistencyError as exc:  # already gone: what needs it refuses, not maintain
        log.warning("%s", exc)
        floor = None
    epoch = current_epoch(layout)
    names = [
        n for n in tables.table_names(pipeline) if DeltaTable.is_deltatable(str(layout.table(n)))
    ]
    files = {
        name: (
            len(DeltaTable(str(layout.table(name))).file_uris()),
            files_on_disk(layout.table(name)),
        )
        for name in names
    }
    output_from = unpublished_from(pipeline, settings, layout)
    grace = Grace(pipeline.reader_grace_hours, store_now, local_now)
    readers = max(
        (grace.retention_us(layout.table(name)) for name in names if name != "state"), default=0
    )
    first = min(
        v + 1
        for v in (
            grace.first_received(received),
            *([] if kept is None else [kept.state_version]),
            *([] if output_from is None else [output_from]),
        )
    )
    stamps = removal_stamps(state, first, listed)
    state_grace = grace.retention_us(state, received, stamps)
    retention, keep = vacuum_rule(boundaries, kept, stamps, local_now, max(readers, state_grace))
    if floor is not None:
        keep = tuple(sorted({*keep, floor.state_version}))
    output_retention = (
        0
        if output_from is None
        else output_retention_hours(output_from, received, stamps, store_now, local_now)
    )
    return MaintenancePlan(
        application_id=pipeline.application_id,
        epoch=epoch,
        reason=reason,
        planned_at_us=store_now,
        horizon_s=pipeline.rewind_horizon_seconds,
        kept=kept,
        retention_hours=int(retention),
        keep_versions=keep,
        table_files=files,
        reader_grace_hours=pipeline.reader_grace_hours,
        stale=tuple(str(p) for p in stale_paths(layout, epoch, tables.table_names(pipeline))),
        output_from=output_from,
        output_retention_hours=int(output_retention),
        floor_version=None if floor is None else floor.state_version,
        planned_local_us=local_now,
    )


def unpublished_from(pipeline: Pipeline, settings: Settings, layout: AppLayout) -> int | None:
    """The first state version the output topic still has to read (None: no output)."""
    if pipeline.output is None:
        return None
    config = kafka_admin.client_config(settings.bootstrap_servers, settings.kafka_client)
    try:
        return versions_needed(layout, read_bookmark(config, pipeline)).start
    except PlatformError as exc:
        raise OutputError(
            f"{pipeline.application_id}: cannot tell which state versions output topic "
            f"{pipeline.output.topic!r} still needs ({exc}); maintain would remove them; "
            "run it again when the broker answers"
        ) from exc


def output_retention_hours(
    output_from: int,
    received: dict[int, int],
    stamps: dict[int, int],
    store_now_us: int,
    local_now_us: int,
) -> int:
    """The state vacuum's retention (whole hours, rounded up, with the plan's margin)
    that keeps the unpublished versions' files, and their change files, which no
    snapshot lists: the vacuum judges those by their time in the store, against
    this machine's clock."""
    written_from = min((at for v, at in received.items() if v >= output_from), default=store_now_us)
    unpublished = max(
        retention_us(stamps, output_from + 1, local_now_us),
        store_now_us - written_from + max(0, local_now_us - store_now_us),
    )
    return -(-(unpublished + PLAN_MARGIN_US) // HOUR_US)


@dataclass(frozen=True)
class Grace:
    """The reader grace: nothing a reader may have listed in the last ``hours`` (by
    the store's clock) is deleted."""

    hours: int
    store_now_us: int
    local_now_us: int

    def first_received(self, received: dict[int, int]) -> int:
        """The version before the first entry the store received within the grace
        (the newest version when none was)."""
        since = self.store_now_us - self.hours * HOUR_US
        inside = [v for v, at in received.items() if at >= since]
        return (min(inside) if inside else max(received, default=0) + 1) - 1

    def retention_us(
        self,
        table: Location,
        received: dict[int, int] | None = None,
        stamps: dict[int, int] | None = None,
    ) -> int:
        """The retention (in Delta's vacuum's frame) that keeps ``table``'s files a
        reader of the grace may read: those removed by entries received within it,
        and, for a batch's files not committed yet, the grace itself on the store's
        clock (what this machine's clock runs ahead of the store's, added)."""
        received = entry_times_us(table) if received is None else received
        first = self.first_received(received) + 1
        stamps = removal_stamps(table, first) if stamps is None else stamps
        ahead = max(0, self.local_now_us - self.store_now_us)
        return max(
            self.hours * HOUR_US + ahead if self.hours else 0,
            retention_us(stamps, first, self.local_now_us),
        )


def entry_times_us(table: Location) -> dict[int, int]:
    return {v: int(s * 1_000_000) for v, s in entry_times(table).items()}


def retention_us(stamps: dict[int, int], first: int, local_now_us: int) -> int:
    """How far back Delta's vacuum, on this machine's clock, must keep removed files
    so that none removed by an entry from version ``first`` on goes: back to the
    earliest stamp those entries' writers put on them."""
    found = [stamp for version, stamp in stamps.items() if version >= first]
    return max(0, local_now_us - min(found) * 1000) if found else 0


def earliest_removal_after(stamps: dict[int, int]) -> Callable[[int], int | None]:
    """version -> the earliest removal stamp of the entries after it (None: none)."""
    versions = sorted(stamps)
    suffix = [stamps[v] for v in versions]
    for i in range(len(suffix) - 2, -1, -1):
        suffix[i] = min(suffix[i], suffix[i + 1])

    def after(version: int) -> int | None:
        i = bisect.bisect_right(versions, version)
        return suffix[i] if i < len(suffix) else None

    return after


def oldest_kept(boundaries: list[Boundary], cutoff_us: int) -> Boundary | None:
    """The last boundary committed at or before the cutoff (a rewind to the horizon
    lands on it), else the oldest one: every boundary from it on stays a target."""
    if not boundaries:
        return None
    by_time = sorted(boundaries, key=lambda b: (b.commit_time_us, b.state_version))
    before = [b for b in by_time if b.commit_time_us <= cutoff_us]
    return before[-1] if before else by_time[0]


def vacuum_rule(
    boundaries: list[Boundary],
    kept: Boundary | None,
    stamps: dict[int, int],
    local_now_us: int,
    grace_us: int,
) -> tuple[int, tuple[int, ...]]:
    """(retention hours, state versions to keep beyond it) so that ``kept`` and every
    later boundary stay loadable, and nothing within the reader grace (``grace_us``,
    rounded up to whole hours) goes. Delta's vacuum deletes a file whose removal
    stamp (``stamps``: each entry's earliest, by its writer) is older than its
    clock less the retention: a version's files go only when an entry after it
    removed them. The retention covers whole hours back to the first removal after
    ``kept``; the boundaries whose files a removal before that cutoff (plus a
    margin for the vacuum running a little after the plan) took away are kept by
    name."""
    grace_hours = -(-grace_us // HOUR_US)
    if kept is None:
        return grace_hours, ()
    retention = max(
        grace_hours, retention_us(stamps, kept.state_version + 1, local_now_us) // HOUR_US
    )
    cutoff = local_now_us - retention * HOUR_US + PLAN_MARGIN_US
    after = earliest_removal_after(stamps)
    # Kept by name too: a boundary nothing has removed files of yet. A removal
    # after the plan (maintain's own compaction, a batch) is stamped after it, by a
    # clock that may be behind, so no retention can be trusted to cover it.
    keep = {
        b.state_version
        for b in boundaries
        if b.state_version >= kept.state_version
        and ((removed := after(b.state_version)) is None or removed * 1000 < cutoff)
    }
    return int(retention), tuple(sorted(keep))


def vacuum_retention_hours(plan: MaintenancePlan, is_state: bool, local_now_us: int) -> int:
    """The retention to vacuum with now: the plan's, and once half the plan's margin
    has passed since it was made, the whole hours since (rounded up) too. Delta's
    vacuum sets its cutoff by its own clock when it starts, so however long the
    compaction before it (or a pause) took, its cutoff stays within half the
    margin of the plan's: the other half covers the moment between this call and
    the vacuum reading its clock."""
    retention = plan.retention_hours
    if is_state:
        retention = max(retention, plan.output_retention_hours)
    elapsed = max(0, local_now_us - plan.planned_local_us)
    if elapsed <= PLAN_MARGIN_US // 2:
        return retention
    return retention + -(-elapsed // HOUR_US)


def stale_paths(layout: AppLayout, epoch: int, names: list[str]) -> list[Location]:
    """Old epochs' Spark checkpoints and seeds (no run or operation reads them again:
    a new epoch starts from its cut); staged data files of batches that can no
    longer commit (``jobs/delta/files.py``); and the raw staging folder that
    versions before tasks staged raw files in the table left behind."""
    found = [layout.checkpoint(older) for older in range(epoch)]
    found = [path for path in found if path.exists()]
    # Seeds, whatever their content's name: every attempt's of every older epoch.
    found += [
        path
        for path, _stat in layout.checkpoints.files()
        if any(path.name.startswith(f"epoch={older}.seed") for older in range(epoch))
    ]
    ledger = layout.table(tables.LEDGER)
    last = (
        committed_batch(DeltaTable(str(ledger)), layout.application_id, epoch)
        if DeltaTable.is_deltatable(str(ledger))
        else None
    )
    for name in names:
        found += stale_staged_files(layout.table(name), epoch, last)
    legacy_staging = layout.root / "_raw_staging"
    if legacy_staging.exists():
        found.append(legacy_staging)
    return found


def refuse_to_maintain(pipeline: Pipeline, layout: AppLayout) -> None:
    """Every refusal of ``maintain``, made when it plans and again when it applies:
    in between, a scheduled stream or an operation may start, or an operation die
    after its fence. (The output topic's bookmark only moves on: the version the
    plan keeps for it stays enough.)"""
    if not DeltaTable.is_deltatable(str(layout.table(tables.LEDGER))):
        raise ConsistencyError(
            f"{pipeline.application_id} has no tables yet: nothing to maintain (run it first)"
        )
    busy = refuse_next_to_an_operation(layout)
    if busy is not None and pipeline.reader_grace_hours == 0:
        raise LockedError(
            f"{pipeline.application_id}: maintenance.reader_grace_hours is 0, and a stream is "
            f"running ({describe(busy)}): vacuum could delete files it is writing; stop the "
            "stream or set reader_grace_hours to 1 or more"
        )
    unfinished = unfinished_operation(layout)
    if unfinished is not None:
        raise ConsistencyError(
            f"{pipeline.application_id}: {unfinished.describe()}; run the same "
            f"{unfinished.operation} again to complete it, then maintain"
        )


def refuse_next_to_an_operation(layout: AppLayout) -> dict[str, Any] | None:
    """The running stream holding the application, if any; an operation: refused."""
    busy = holder(layout)
    if busy is not None and not str(busy.get("purpose", "")).startswith("run"):
        raise LockedError(
            f"application {layout.application_id} is busy: held by {describe(busy)}; "
            "maintain runs next to a stream, not next to an operation"
        )
    return busy


def _retrying(what: str, action: Callable[[], Any]) -> Any:
    """A commit that lost to a concurrent one (a stream's batch) is tried again on
    the new snapshot; the data it rewrites is the same either way."""
    for attempt in range(MAX_ATTEMPTS):
        check_hold()
        try:
            return action()
        except CommitFailedError as exc:
            log.info("%s: concurrent commit (%s); retrying (%d)", what, exc, attempt + 1)
            time.sleep(0.2 * (attempt + 1))
    raise ConsistencyError(f"{what}: gave up after {MAX_ATTEMPTS} concurrent conflicts")


def apply_maintenance(
    pipeline: Pipeline, settings: Settings, plan: MaintenancePlan, echo: Callable[[str], None]
) -> dict[str, Any]:
    layout = AppLayout(settings.warehouse, pipeline.application_id)
    # The promise first: from this row on, planners refuse older boundaries.
    append_audit(
        layout, audit_row(pipeline, MAINTAIN, plan.epoch, {**plan.details(), "phase": STARTED})
    )
    # After the promise: an operation that starts from here on plans with it.
    refuse_to_maintain(pipeline, layout)  # what started (or died) while we planned
    result: dict[str, Any] = {}
    for name in plan.table_files:
        result[name] = maintain_table(layout.table(name), plan, name == "state")
        echo(f"  {name}: {result[name]}")
    deleted = 0
    for stale in map(Location, plan.stale):
        if stale.is_dir():
            stale.delete_tree()
        else:
            stale.delete()
        deleted += 1
    result["stale_paths_deleted"] = deleted
    append_audit(
        layout,
        audit_row(
            pipeline, MAINTAIN, plan.epoch, {**plan.details(), "phase": DONE, "result": result}
        ),
    )
    return result


def maintain_table(path: Location, plan: MaintenancePlan, is_state: bool) -> dict[str, int]:
    """Compact, vacuum (keeping the plan's versions of ``state``), then drop the log
    entries below the oldest version that must stay loadable. Each commit carries
    the fence of the epoch the plan was made in, checked in the snapshot it commits
    on (``OperationFence``): an operation that moved the application on since makes
    this maintain commit nothing more (its plan may no longer hold)."""
    uri = str(path)
    fence = OperationFence(
        plan.application_id, plan.epoch, MAINTAIN, {"reason": plan.reason}, "maintenance"
    )

    def fenced(commit: Callable[[DeltaTable, CommitProperties], Any]) -> Callable[[], Any]:
        def on_a_new_snapshot() -> Any:
            table = DeltaTable(uri)
            return commit(table, fence.on(table))

        return on_a_new_snapshot

    # Only ``state`` is read at old versions (a rewind's seed); the other tables
    # stay loadable from the version they had when this began (a writer that loaded
    # one a moment ago still finds the entries it needs).
    current = DeltaTable(uri).version()
    floor = current
    if is_state and plan.kept is not None:
        floor = min(floor, plan.kept.state_version)
    if is_state and plan.output_from is not None:
        floor = min(floor, plan.output_from)
    if is_state and plan.floor_version is not None:
        floor = min(floor, plan.floor_version)
    compacted = _retrying(
        f"compact {path.name}",
        fenced(lambda table, props: table.optimize.compact(commit_properties=props)),
    )
    keep = list(plan.keep_versions) if is_state and plan.keep_versions else None
    retention = vacuum_retention_hours(plan, is_state, int(time.time() * 1_000_000))
    removed = _retrying(
        f"vacuum {path.name}",
        fenced(
            lambda table, props: table.vacuum(
                retention_hours=retention,
                dry_run=False,
                enforce_retention_duration=False,
                keep_versions=keep,
                full=True,
                commit_properties=props,
            )
        ),
    )
    configured = DeltaTable(uri).metadata().configuration
    outdated = {k: v for k, v in TABLE_CONFIGURATION.items() if configured.get(k) != v}
    if outdated:  # a table made before the platform set these (jobs/delta/log.py)
        _retrying(
            f"log settings of {path.name}",
            fenced(
                lambda table, props: table.alter.set_table_properties(
                    outdated, commit_properties=props
                )
            ),
        )
    log_entries = keep_loadable_from(path, floor, plan.reader_grace_hours * 3600)
    return {
        "files_compacted": int(compacted.get("numFilesRemoved", 0)),
        "files_added": int(compacted.get("numFilesAdded", 0)),
        "files_vacuumed": len(removed),
        "log_entries_dropped": log_entries,
        "live_files": len(DeltaTable(uri).file_uris()),
        "files_on_disk": files_on_disk(path),
    }


def run_maintain(
    pipeline: Pipeline,
    settings: Settings,
    reason: str,
    dry_run: bool,
    echo: Callable[[str], None] = print,
) -> MaintenancePlan:
    plan = plan_maintenance(pipeline, settings, reason)
    echo(plan.describe())
    layout = AppLayout(settings.warehouse, pipeline.application_id)
    if dry_run:
        append_audit(
            layout, audit_row(pipeline, MAINTAIN, plan.epoch, {**plan.details(), "dry_run": True})
        )
        echo("dry run: nothing was changed (the plan is recorded in the ledger)")
        return plan
    result = apply_maintenance(pipeline, settings, plan, echo)
    echo(f"maintained: {json.dumps(result, sort_keys=True)}")
    return plan
