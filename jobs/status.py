"""Where an application stands, from its ledger (not from the Spark checkpoint),
compared with the broker and the checkpoint, plus every inconsistency we can see."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from deltalake import DeltaTable

from jobs import kafka_admin
from jobs.cut import (
    check_readable,
    check_same_topics,
    current_log_history,
    latest_cut,
    live_boundaries,
    needs_rekeying,
    same_ids,
)
from jobs.delta.layout import AppLayout
from jobs.errors import ConfigError, PlatformError
from jobs.kafka_source import offsets as plan
from jobs.ledger import (
    IS_BATCH,
    batch_rows,
    current_epoch,
    current_ledger,
    kept_state_version,
    last_batch,
    read_ledger,
    unfinished_operation,
)
from jobs.lineage import Intervals
from jobs.lock import holder
from jobs.output.bookmark import repair
from jobs.output.publisher import read_bookmark
from jobs.pipeline.model import Pipeline
from jobs.settings import Settings
from jobs.streaming import offset_log

COUNT_COLUMNS = (
    "records_in",
    "records_valid",
    "filtered",
    "dead_lettered",
    "aggregated",
    "late_dropped",
)


@dataclass
class PartitionLag:
    topic: str
    partition: int
    committed: int | None
    log_start: int | None
    log_end: int | None
    lag: int | None


@dataclass
class Status:
    application_id: str
    pipeline_version: int
    epoch: int
    last_batch: dict[str, Any] | None
    batches_committed: int
    totals: dict[str, int]
    partitions: list[PartitionLag] = field(default_factory=list)
    state_rows: int = 0
    # The oldest batch end a rewind can still restore (``maintain`` vacuums older ones).
    oldest_rewind_target: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)
    repair: str | None = None  # the operation that fits what was found
    # The output topic: what it holds of the state's versions (None: no output).
    output: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# What status reads of each batch row: not the per-batch details (the ledger grows
# by a row per batch; the biggest column stays on disk).
STATUS_COLUMNS = [
    "entry_type",
    "epoch",
    "batch_id",
    "start_offsets",
    "end_offsets",
    "commit_time",
    *COUNT_COLUMNS,
    "processing_guarantee",
]


def application_status(
    pipeline: Pipeline, settings: Settings, with_broker: bool = True, audit: bool = True
) -> Status:
    """``audit``: check every batch row (the CLI's ``status``); without it (the health
    sensor's poke) only the newest batch is read, in bounded memory, and totals and
    the per-batch checks are left out."""
    layout = AppLayout(settings.warehouse, pipeline.application_id)
    epoch = current_epoch(layout)
    problems: list[str] = []
    unfinished = unfinished_operation(layout)
    if unfinished is not None:
        problems.append(
            f"unfinished operation: {unfinished.describe()}; `run` refuses until it is "
            f"completed: run the same {unfinished.operation} again"
        )
    totals: dict[str, int] = {}
    batches_committed = 0
    if audit:
        rows = batch_rows(read_ledger(layout, STATUS_COLUMNS, IS_BATCH))
        last = rows[-1] if rows else None
        batches_committed = len(rows)
        if rows:
            totals = {c: sum(int(r[c] or 0) for r in rows) for c in COUNT_COLUMNS}
            history = (
                None if (ledger_now := current_ledger(layout)) is None else ledger_now.history()
            )
            standing = {} if history is None else history.standing()
            # What standing backfills judged again: earlier batches' rows there are gone.
            rejudged = [
                (epoch, history.recomputed(epoch))
                for epoch in standing
                if history is not None
                and getattr(history.steps.get(epoch), "action", "") == "publish"
            ]
            _check_batches(rows, dead_letter_rows(layout), standing, rejudged, problems)
        in_epoch = [int(r["batch_id"]) for r in rows if r["epoch"] == epoch]
        newest_in_epoch = max(in_epoch) if in_epoch else None
    else:
        last = last_batch(layout)
        newest_in_epoch = None if last is None or last["epoch"] != epoch else last["batch_id"]
    if last is None:
        status = Status(pipeline.application_id, pipeline.version, epoch, None, 0, {})
        status.partitions = _lags(pipeline, settings, {}, problems) if with_broker else []
        status.problems = problems
        return status

    repair = _check_checkpoint(layout, epoch, newest_in_epoch, problems)
    cut = latest_cut(layout, epoch)
    if repair is None and cut is not None and needs_rekeying(pipeline, cut):
        problems.append(
            f"epoch {epoch}'s checkpoint keys hopping windows by their start, this platform "
            "by their last pane: run refuses it until a rebuild seeds a new checkpoint from "
            "the published state (unchanged)"
        )
        repair = "rebuild"
    if repair is None and audit and cut is not None and pipeline.enrich:
        repair = _check_replayed_tables(pipeline, layout, epoch, cut.offsets(), problems)
    lags = []
    if with_broker:
        committed, topic_ids = reading_from(layout, epoch, last, problems)
        lags = _lags(pipeline, settings, committed, problems, topic_ids)
    state_rows = DeltaTable(str(layout.table("state"))).count()
    summary = {k: last[k] for k in ("epoch", "batch_id", "commit_time", "end_offsets")}
    summary["commit_time"] = str(summary["commit_time"])
    return Status(
        application_id=pipeline.application_id,
        pipeline_version=pipeline.version,
        epoch=epoch,
        last_batch=summary,
        batches_committed=batches_committed,
        totals=totals,
        partitions=lags,
        state_rows=int(state_rows),
        oldest_rewind_target=_oldest_rewind_target(layout) if audit else None,
        problems=problems,
        repair=repair,
        output=_output(pipeline, settings, layout, problems) if with_broker else None,
    )


def _output(
    pipeline: Pipeline, settings: Settings, layout: AppLayout, problems: list[str]
) -> dict[str, Any] | None:
    if pipeline.output is None:
        return None
    current = DeltaTable(str(layout.table("state"))).version()
    found: dict[str, Any] = {"topic": pipeline.output.topic, "state_version": current}
    config = kafka_admin.client_config(settings.bootstrap_servers, settings.kafka_client)
    try:
        mark = read_bookmark(config, pipeline)
    except PlatformError as exc:
        problems.append(f"output: {exc}")
        return found
    found["published_through"] = None if mark is None else mark.next_version - 1
    found["unpublished_versions"] = current + 1 - (0 if mark is None else mark.next_version)
    if mark is not None and mark.next_version > current + 1:
        problems.append(
            f"output topic {pipeline.output.topic!r} holds state versions up to "
            f"{mark.next_version - 1}, past the state table's {current}; "
            + repair(layout.application_id)
        )
    return found


def _oldest_rewind_target(layout: AppLayout) -> dict[str, Any] | None:
    """The oldest boundary a rewind can still restore (of the topics' current logs)."""
    kept = kept_state_version(layout) or 0
    ledger_now = current_ledger(layout)
    if ledger_now is None:
        return None
    for b in live_boundaries(layout, ledger_now, current_log_history(layout, ledger_now).excluded):
        if b.state_version >= kept:
            return {
                "epoch": b.epoch,
                "batch_id": b.batch_id,
                "end_offsets": plan.to_json_dict(b.end_offsets),
                "state_version": b.state_version,
            }
    return None


def dead_letter_rows(layout: AppLayout) -> dict[tuple[int, int], int]:
    """Rows of ``dead_letter`` per (epoch, batch id), read after the ledger: a batch
    committing meanwhile has no ledger row to be compared with."""
    path = layout.table("dead_letter")
    if not DeltaTable.is_deltatable(str(path)):
        return {}
    ids = DeltaTable(str(path)).to_pyarrow_dataset().to_table(columns=["epoch", "batch_id"])
    counted = ids.group_by(["epoch", "batch_id"]).aggregate([("epoch", "count")]).to_pylist()
    return {(int(c["epoch"]), int(c["batch_id"])): int(c["epoch_count"]) for c in counted}


def _check_batches(
    rows: list[dict[str, Any]],
    letters: dict[tuple[int, int], int],
    standing: dict[int, int | None],
    rejudged: list[tuple[int, Intervals]],
    problems: list[str],
) -> None:
    """Each batch row against the one before it and against ``dead_letter``, which
    its commit wrote first (``letters``: rows per batch). A batch a repair
    discarded (outside ``standing``, ``History.standing``) has its dead letters
    until the next run's start removes them (``jobs/superseded.py``), and a batch
    of an epoch before a backfill whose ranges (``rejudged``) it overlaps has the
    ones the backfill did not judge again."""
    seen: set[tuple[int, int]] = set()
    previous_end: dict[int, str] = {}
    for row in rows:
        ident = (row["epoch"], row["batch_id"])
        if ident in seen:
            problems.append(f"batch {ident[1]} of epoch {ident[0]} is in the ledger twice")
        seen.add(ident)
        filtered = row.get("filtered") or 0  # null: a ledger row from before filters
        if row["records_in"] != row["records_valid"] + filtered + row["dead_lettered"]:
            problems.append(f"batch {ident}: records_in != valid + filtered + dead-lettered")
        # At least once, a replay may append a batch's dead letters again.
        counted, found = row["dead_lettered"] or 0, letters.get(ident, 0)
        replayed = row["processing_guarantee"] == "at_least_once"
        last = standing.get(ident[0], -1)
        discarded = last is not None and ident[1] > last
        if discarded and found in (0, counted):
            pass  # superseded: the replay judged its records again
        elif found <= counted and _judged_again(row, rejudged):
            pass  # the backfill's dead letters stand for those it judged again
        elif found < counted or (found > counted and not replayed):
            problems.append(
                f"batch {ident}: {counted} dead-lettered per the ledger, "
                f"{found} rows in dead_letter"
            )
        end = previous_end.get(row["epoch"])
        # A partition added to the topic since the previous batch starts at 0.
        if end is not None and json.loads(row["start_offsets"]) != offset_log.batch_start(
            json.loads(end), json.loads(row["end_offsets"])
        ):
            problems.append(
                f"batch {ident}: starts at {row['start_offsets']}, previous ended at {end}"
            )
        previous_end[row["epoch"]] = row["end_offsets"]


def _check_replayed_tables(
    pipeline: Pipeline, layout: AppLayout, epoch: int, cut: plan.Offsets, problems: list[str]
) -> str | None:
    """What ``run`` refuses before its first batch: a replay of records judged before
    (after a rewind) that needs a dimension table no longer readable as its batches
    joined it (a version gone, or the table deleted and loaded again)."""
    ledger_now = current_ledger(layout)
    if ledger_now is None:
        return None
    history = current_log_history(layout, ledger_now)
    committed = offset_log.committed_batches(layout.checkpoint(epoch))
    reading = history.replay_from(cut, committed[-1] if committed else None)
    names = tuple(e.name for e in pipeline.enrich)
    decisions = history.replay_decisions(reading, names)
    for i, e in enumerate(pipeline.enrich):
        pins = {d[6 + i] for d in decisions if d[6 + i] is not None}
        try:
            check_readable(pipeline.application_id, e.name, e.path(layout.warehouse), pins)
        except ConfigError as exc:
            problems.append(f"the next run's replay: {str(exc).split('; repair:')[0]}")
            return "backfill --from-earliest --dimensions newest"
    return None


def _check_checkpoint(
    layout: AppLayout, epoch: int, newest_in_epoch: int | None, problems: list[str]
) -> str | None:
    """Problems of the Spark checkpoint; returns "rebuild" when Spark's state is damaged."""
    checkpoint = layout.checkpoint(epoch)
    if newest_in_epoch is None:
        return None
    batches = f"batches up to {newest_in_epoch}"
    if not checkpoint.is_dir():
        problems.append(
            f"checkpoint {checkpoint} is missing but the ledger has {batches} "
            "of this epoch: the Spark state is lost"
        )
        return "rebuild"
    commits = offset_log.committed_batches(checkpoint)
    planned = offset_log.offset_batches(checkpoint)
    try:
        for batch in planned[-2:]:
            offset_log.read_offsets(checkpoint, batch)
    except PlatformError as exc:
        problems.append(f"the checkpoint is unreadable: {exc}")
        return "rebuild"
    state_dir = checkpoint / "state"
    if commits and not state_dir.all_files():
        problems.append(
            f"Spark's state store under {state_dir} is empty but the ledger has "
            f"{batches}: the aggregation would restart from nothing"
        )
        return "rebuild"
    # Spark writes offsets/<n> before batch n, and commits/<n> after it returned
    # (the platform's ledger row is written in between); it plans n+1 only after
    # commits/<n>. So the newest planned batch may be in flight, but a planned batch
    # below it without its commit is one Spark could not have left.
    in_flight = planned[-1] if planned and planned[-1] not in commits else None
    gone = [b for b in planned if b not in commits and b != in_flight]
    if gone:
        problems.append(
            f"offsets for batches {gone} but no commits in {checkpoint}: the commit log is gone"
        )
        return "rebuild"
    if commits and max(commits) > newest_in_epoch:
        # The ledger was read before this listing: a batch may have committed since.
        newest = last_batch(layout)
        if newest is not None and newest["epoch"] == epoch:
            newest_in_epoch = max(newest_in_epoch, int(newest["batch_id"]))
    if commits and max(commits) > newest_in_epoch:
        problems.append(
            f"Spark committed batch {max(commits)} but the ledger ends at {newest_in_epoch}: "
            "batches were committed without the platform's commit"
        )
        return "rebuild"
    running = holder(layout)
    if in_flight is not None and not str((running or {}).get("purpose", "")).startswith("run"):
        problems.append(
            f"batch {in_flight} was planned but not committed by Spark (the run stopped "
            "in it): the next run replays it with the same offsets"
        )
    return None


def _lags(
    pipeline: Pipeline,
    settings: Settings,
    committed: plan.Offsets,
    problems: list[str],
    topic_ids: dict[str, str] | None = None,
) -> list[PartitionLag]:
    config = kafka_admin.client_config(settings.bootstrap_servers, settings.kafka_client)
    try:
        partitions = kafka_admin.topic_partitions(
            kafka_admin.admin(config), pipeline.topics, settings.bootstrap_servers
        )
        marks = kafka_admin.watermarks(
            config, [(t, p) for t, parts in partitions.items() for p in parts]
        )
    except PlatformError as exc:
        problems.append(f"broker: {exc}")
        return []
    ids_now: dict[str, str] | None = None
    try:
        ids_now = kafka_admin.topic_ids(kafka_admin.admin(config), pipeline.topics)
    except PlatformError as exc:
        problems.append(str(exc))  # and the offsets are still checked, without ids
    try:
        plan.check_continuity(committed, marks, same_ids(topic_ids or {}, ids_now or {}))
        if ids_now is not None:
            check_same_topics(topic_ids or {}, ids_now)
    except PlatformError as exc:
        problems.append(str(exc))
    result = []
    for (topic, part), (low, high) in sorted(marks.items()):
        done = committed.get((topic, part))
        lag = None if done is None else high - done
        if done is not None and done < low:
            problems.append(
                f"{topic}[{part}]: committed offset {done} is below the log start {low} "
                "(records deleted by retention before they were processed)"
            )
        result.append(PartitionLag(topic, part, done, low, high, lag))
    return result


def format_status(status: Status) -> str:
    lines = [f"application {status.application_id} (pipeline v{status.pipeline_version})"]
    lines.append(f"  epoch: {status.epoch}")
    if status.last_batch is None:
        lines.append("  last committed batch: none yet")
    else:
        b = status.last_batch
        when = b["commit_time"]
        lines.append(f"  last committed batch: epoch {b['epoch']} batch {b['batch_id']} at {when}")
        lines.append(
            f"  batches committed: {status.batches_committed}; state rows: {status.state_rows}"
        )
        lines.append("  totals: " + ", ".join(f"{k} {v}" for k, v in status.totals.items()))
    target = status.oldest_rewind_target
    if target is not None:
        lines.append(
            f"  oldest rewind target: epoch {target['epoch']} batch {target['batch_id']} "
            f"(--to-offset '{json.dumps(target['end_offsets'], sort_keys=True)}')"
        )
    if status.partitions:
        lines.append("  partition            committed    log end      lag")
        for p in status.partitions:
            committed = "-" if p.committed is None else str(p.committed)
            lag = "-" if p.lag is None else str(p.lag)
            name = f"{p.topic}[{p.partition}]"
            lines.append(f"  {name:<20} {committed:>9} {p.log_end:>10} {lag:>8}")
    if status.output is not None:
        out = status.output
        through = out.get("published_through")
        lines.append(
            f"  output topic {out['topic']}: state versions published through "
            f"{'none' if through is None else through} of {out['state_version']}"
            + (
                f" ({out['unpublished_versions']} to publish: the next run or `publish` does)"
                if out.get("unpublished_versions", 0) > 0
                else ""
            )
        )
    if status.problems:
        lines.append("  problems:")
        lines += [f"    - {p}" for p in status.problems]
        if status.repair:
            lines.append(
                f"  repair: python -m jobs {status.repair} --pipeline {status.application_id} "
                "--reason '...' --dry-run  (then without --dry-run)"
            )
    else:
        lines.append("  problems: none found")
    return "\n".join(lines)


def reading_from(
    layout: AppLayout, epoch: int, last: dict[str, Any], problems: list[str]
) -> tuple[plan.Offsets, dict[str, str]]:
    """Where the next run reads from, and the topic ids it reads: the last batch's
    end, or the newest cut when an operation began an epoch after that batch (after
    a recreated topic's repair, the last batch's offsets are positions in the deleted
    log; a fence epoch after it has no cut of its own). Read cheaply: the health
    sensor calls this too."""
    try:
        cut = latest_cut(layout, epoch)
    except PlatformError as exc:
        problems.append(str(exc))
        cut = None
    ids = {} if cut is None else cut.topic_ids
    if cut is not None and cut.epoch > int(last["epoch"]):
        return cut.offsets(), ids
    return plan.from_json_dict(json.loads(last["end_offsets"])), ids


def _judged_again(row: dict[str, Any], rejudged: list[tuple[int, Intervals]]) -> bool:
    """Whether a later backfill judged some of the batch's [start, end) again."""
    start, end = json.loads(row["start_offsets"]), json.loads(row["end_offsets"])
    for epoch, ranges in rejudged:
        if epoch <= row["epoch"]:
            continue
        for topic, parts in end.items():
            for part, stop in parts.items():
                begin = int(start.get(topic, {}).get(part, 0))
                spans = ranges.get((topic, int(part)), [])
                if any(b < int(stop) and begin < e for b, e in spans):
                    return True
    return False
