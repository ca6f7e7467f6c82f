"""Backfill after a bug fix: recompute the state with the current pipeline version in
a Spark batch job, preview the corrections, publish them atomically, and restart the
stream from the backfill's end offsets with the corrected state.

The recomputation starts at a batch boundary at or before the requested start
(``--from-earliest``: the application's first offsets and empty state, or, after a
recreated topic's repair, that repair's cut and the state it kept) and reads up to
where the application's live lineage ends (its last batch, or the cut of the
operation that began the epoch): only records the stream has judged, each with
the watermark and batch time its batch recorded and its dead letters already
written. The stream reads the rest from Kafka as usual after the backfill, so
every record's decision is recorded once. Publishing is one MERGE commit on
``state`` (the change data feed shows every correction as an update pre/post image;
a reader sees the state before or after, never half) and one append of the
corrections to ``changelog``, both in the new epoch after the stream was fenced.
Records the stream dead-lettered as late stay out of the recomputation too: each
record is checked against the watermark the ledger says it was processed with.
"""

from __future__ import annotations

import functools
import json
import operator
import time
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import numpy
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.cut import (
    StateAction,
    boundary_at_or_before,
    current_log_history,
    fill_from_first,
    floor_note,
    lineage_head,
    log_floor,
    replay_from_origin,
    state_behind,
)
from jobs.delta import layout as tables
from jobs.delta.cdf import AFTER, rows_of, version_changes
from jobs.delta.layout import AppLayout
from jobs.delta.writer import OperationFence
from jobs.errors import ConfigError
from jobs.faults import maybe_crash
from jobs.kafka_source import offsets as kafka_offsets
from jobs.kafka_source import spark_kafka
from jobs.ledger import LedgerVersion, current_epoch, current_ledger
from jobs.lineage import (
    Boundary,
    Coverage,
    Intervals,
    Pin,
    layers,
    named,
    pins_text,
    spelled,
)
from jobs.operations.apply import apply_plan, check_seed_shape
from jobs.operations.plan import Plan, header
from jobs.operations.restart import broker_marks, check_listed, other_logs
from jobs.operations.shadow import (
    CATCH_UP_RECORDS,
    Form,
    Shadow,
    beside_the_stream,
    catch_up_fenced,
    form_of,
)
from jobs.operations.targets import TargetSpec, resolve_targets
from jobs.pipeline.model import Pipeline, stored_column
from jobs.progress import SparkJobProgress
from jobs.resolution import Resolved, load_stored, store
from jobs.settings import Settings
from jobs.state_seed import seed_rows
from jobs.streaming import analyser, enrichment, judging, table_versions
from jobs.streaming.judging import BATCH_TIME_COLUMN, WATERMARK_COLUMN
from jobs.streaming.query import aggregate
from jobs.warehouse import Location

SAMPLES = 10


def plan_backfill(
    pipeline: Pipeline,
    settings: Settings,
    reason: str,
    start: TargetSpec,
    source: str = "kafka",
    dimensions_from: str = "recorded",
) -> Plan:
    layout = AppLayout(settings.warehouse, pipeline.application_id)
    epoch = current_epoch(layout)
    last = lineage_head(layout)
    current = last.end_offsets if last else {}
    if last is None:
        raise ConfigError(
            f"{pipeline.application_id} has no committed batch: nothing to backfill (run the "
            "pipeline; it judges every record as it reads it)"
        )
    config, marks = broker_marks(pipeline, settings)
    check_listed(pipeline, settings, layout, last, marks)
    if source == "archive":
        marks = _archive_marks(pipeline, marks, current)
    # From the first offsets: the floor's state (a recreated topic's deleted log's
    # judgments), or empty. From a time or offsets: the boundary at or before it.
    wanted: kafka_offsets.Offsets | None = None
    if start.kind == "earliest":
        boundary = log_floor(layout)
    else:
        wanted = resolve_targets(start, current, marks, config)
        boundary = boundary_at_or_before(layout, wanted, other_logs(pipeline, settings, layout))
    notes = []
    if boundary is not None and boundary.floor:
        notes.append(floor_note(boundary, wanted))
    # Every partition of the head gets its first offset: a partition the boundary
    # does not name (added later) is read from where the application first read it.
    if boundary is None:
        read_from = replay_from_origin(layout, marks, f"a backfill from {source}")
    else:
        read_from = fill_from_first(layout, boundary.end_offsets, marks)
    # To where the stream's decisions are recorded (a partition it never read: none),
    # reading only what the state judged: a range a skip left out stays out.
    head = {tp: current.get(tp, off) for tp, off in read_from.items()}
    ranges, gaps = judged_since(layout, boundary, read_from)
    if gaps:
        notes.append(f"leaves out the ranges a skip left out ({spelled(gaps)}): they stay unjudged")
    newest = {}
    if pipeline.enrich:
        if dimensions_from == "newest":
            newest = {
                e.name: table_versions.newest_pin(e.path(settings.warehouse)).to_json()
                for e in pipeline.enrich
            }
        notes.append(_dimension_note(layout, pipeline, newest))
    plan = Plan(
        **header("backfill", pipeline.application_id, reason, epoch, current),
        dimensions=dimensions_from,
        dimension_versions=newest,
        target_offsets=head,
        seed_state_version=None if boundary is None else boundary.state_version,
        state_action=StateAction.PUBLISH,
        boundary=boundary,
        records_to_replay=sum(e - b for spans in ranges.values() for b, e in spans),
        source=source,
        read_from=read_from,
        read_ranges=named(ranges),
        notes=[
            f"recomputes with pipeline version {pipeline.version} from "
            f"{kafka_offsets.to_json_dict(read_from)} to the stream's last committed offsets, "
            "in one batch job; the stream reads on from there",
            *notes,
        ],
    )
    _refuse_before_fencing(layout, pipeline, plan)
    return plan


def _archive_marks(
    pipeline: Pipeline,
    marks: dict[tuple[str, int], tuple[int, int]],
    current: kafka_offsets.Offsets,
) -> dict[tuple[str, int], tuple[int, int]]:
    """The offsets a backfill from the raw archive can read: any from 0 (the archive
    holds what retention deleted) to the broker's log end (a start past the stream's
    last batch is a start like any other)."""
    if not pipeline.archive:
        raise ConfigError(f"{pipeline.application_id} keeps no raw archive (archive: false)")
    return {
        tp: (0, max(marks.get(tp, (0, 0))[1], current.get(tp, 0)))
        for tp in set(marks) | set(current)
    }


def _refuse_before_fencing(layout: AppLayout, pipeline: Pipeline, plan: Plan) -> None:
    """The refusals a backfill makes before anything is fenced (the plan is made
    before and under the lock): tables that cannot take the new definition, a
    redefinition the plan does not publish, a seed of the wrong shape."""
    resolved = load_stored(layout, pipeline)
    tables.ensure_tables(layout, resolved, republishing=True)
    check_redefinition(layout, resolved, plan)
    check_seed_shape(layout, pipeline, plan)


def _dimension_note(
    layout: AppLayout, pipeline: Pipeline, newest: dict[str, dict[str, Any]]
) -> str:
    """Which versions of the enrichments' tables the recomputation joins: the ones
    the batches recorded, or (recorded -> ``newest``) each table's newest."""
    ledger_now = current_ledger(layout)
    head = Coverage() if ledger_now is None else current_log_history(layout, ledger_now).head
    names = tuple(e.name for e in pipeline.enrich)
    parts = []
    for i, e in enumerate(pipeline.enrich):
        recorded = {d[6 + i] for d in head.decisions(names) if d[6 + i] is not None}
        shown = pins_text(recorded, e.path(layout.warehouse)) or "none recorded"
        parts.append(f"{e.name} {shown}" + (f" -> {newest[e.name]['version']}" if newest else ""))
    how = (
        "each table's newest version (recorded -> newest)"
        if newest
        else "the table versions the batches recorded"
    )
    return f"joins {how}: {'; '.join(parts)}"


def judged_since(
    layout: AppLayout, boundary: Boundary | None, read_from: kafka_offsets.Offsets
) -> tuple[Intervals, Intervals]:
    """The offsets the state judged after ``boundary`` (all, without one), and the
    gaps (skipped ranges) among them from ``read_from`` on: what a backfill reads
    and what it leaves out."""
    ledger_now = current_ledger(layout)
    if ledger_now is None:
        return {}, {}
    history = current_log_history(layout, ledger_now)
    head = history.head
    judged = head.judged() if boundary is None else head.excluding(history.coverage_at(boundary))
    gaps = {
        tp: [(max(b, read_from.get(tp, b)), e) for b, e in spans if e > read_from.get(tp, b)]
        for tp, spans in head.gaps().items()
    }
    return judged, {tp: spans for tp, spans in gaps.items() if spans}


def recompute(
    spark: SparkSession,
    resolved: Resolved,
    settings: Settings,
    plan: Plan,
    ranges: Intervals | None = None,
    onto: pa.Table | None = None,
) -> tuple[pa.Table, pa.Table]:
    """The corrected state: the boundary's state plus every record it judged after
    it; and the dead letters of those records, as judged again. ``ranges`` and
    ``onto``: only those offsets, aggregated onto these rows (a shadow's,
    ``shadow.py``) instead of the boundary's state."""
    ranges = plan.ranges() if ranges is None else ranges
    reads = layers(ranges)
    raw = read_records(spark, resolved, settings, *reads[0], plan.source) if reads else None
    for start, end in reads[1:]:
        raw = raw.unionByName(read_records(spark, resolved, settings, start, end, plan.source))  # type: ignore[union-attr]
    if raw is None:
        raw = read_records(spark, resolved, settings, {}, {}, plan.source)
    letters: list[pa.Table] = []
    records = sum(e - b for spans in ranges.values() for b, e in spans)
    with SparkJobProgress(spark, "backfill", records):
        corrected = aggregate_records(
            spark,
            resolved,
            settings,
            raw,
            plan.seed_state_version if onto is None else onto,
            dimension_versions=plan.pins(),
            reading=ranges,
            letters=letters,
        )
    return corrected, letters[0]


def read_records(
    spark: SparkSession,
    resolved: Resolved,
    settings: Settings,
    start: kafka_offsets.Offsets,
    end: kafka_offsets.Offsets,
    source: str = "kafka",
) -> DataFrame:
    """The records [start, end) per partition, from Kafka or the raw archive."""
    layout = AppLayout(settings.warehouse, resolved.application_id)
    if source == "archive":
        return archived_records(spark, layout, start, end)
    return spark_kafka.read_range(
        spark, settings.bootstrap_servers, settings.kafka_client, start, end, resolved.uses_headers
    )


def aggregate_records(
    spark: SparkSession,
    resolved: Resolved,
    settings: Settings,
    raw: DataFrame,
    seed: int | pa.Table | None = None,
    keep: Callable[[DataFrame], DataFrame] | None = None,
    ledger_now: LedgerVersion | None = None,
    dimension_versions: dict[str, Pin] | None = None,
    reading: Intervals | None = None,
    letters: list[pa.Table] | None = None,
) -> pa.Table:
    """``raw`` judged as the stream judged it (the ledger's watermarks and batch
    times), aggregated with the pipeline, plus a seed: a state version's rows, or
    rows of the aggregate's columns;
    ``keep`` filters the contributions (a sample of keys). ``ledger_now``: the ledger read
    the caller planned from (verify's), else one read now. ``reading``: the offsets
    ``raw`` holds (only their judgments are joined, their table versions read).
    ``letters``: gets the records judged dead letters (``dead_letter``'s columns
    but the stamps), from the same read of the records."""
    layout = AppLayout(settings.warehouse, resolved.application_id)
    ledger_now = ledger_now or current_ledger(layout)
    head = Coverage() if ledger_now is None else current_log_history(layout, ledger_now).head
    raw = with_stream_decisions(spark, raw, head, resolved, dimension_versions, reading)
    classified = judging.classify(raw, resolved)
    if letters is not None:
        classified = classified.persist()  # one read of the records for both
    try:
        if letters is not None:
            letters.append(dead_letters_of(classified))
        return _aggregated(spark, resolved, layout, classified, seed, keep)
    finally:
        if letters is not None:
            classified.unpersist()


def _aggregated(
    spark: SparkSession,
    resolved: Resolved,
    layout: AppLayout,
    classified: DataFrame,
    seed: int | pa.Table | None,
    keep: Callable[[DataFrame], DataFrame] | None,
) -> pa.Table:
    """The judged records' contributions (plus a seed's rows: a state version's, or
    the rows given; kept by ``keep``) aggregated with the pipeline."""
    contributions = judging.contributions(classified, resolved)
    rows = (
        DeltaTable(str(layout.table("state")), version=seed).to_pyarrow_table()
        if isinstance(seed, int)
        else seed
    )
    if rows is not None and rows.num_rows:
        added = seed_rows(rows, resolved.pipeline)
        contributions = contributions.unionByName(spark.createDataFrame(added))
    if keep is not None:
        contributions = keep(contributions)
    corrected = aggregate(contributions, resolved).toArrow()
    return corrected.cast(resolved.aggregate_schema)


def dead_letters_of(classified: DataFrame) -> pa.Table:
    """The records ``judging.classify`` judged dead letters, as ``dead_letter`` rows
    without the epoch, batch and commit time (dead letters are rare: collected)."""
    rows = classified.where(F.col("_reason").isNotNull()).select(
        F.col("_topic").alias("topic"),
        F.col("_partition").alias("partition"),
        F.col("_offset").alias("offset"),
        F.col("_key").alias("key"),
        F.col("_value").alias("value"),
        F.col("_timestamp").alias("kafka_timestamp"),
        F.col("_reason").alias("reason"),
    )
    names = ["topic", "partition", "offset", "key", "value", "kafka_timestamp", "reason"]
    schema = pa.schema([tables.DEAD_LETTER_SCHEMA.field(n) for n in names])
    return rows.toArrow().cast(schema)


def with_stream_decisions(
    spark: SparkSession,
    raw: DataFrame,
    head: Coverage,
    resolved: Resolved,
    dimension_versions: dict[str, Pin] | None = None,
    reading: Intervals | None = None,
) -> DataFrame:
    """Each record with the watermark, the batch time and the dimension versions the
    stream judged it with (the judges of the state's coverage), so that ``classify``
    leaves out exactly the records the stream dead-lettered (late, or too far ahead
    of its batch) and joins the tables as the stream did. ``dimension_versions``:
    these versions instead (a backfill after a dimension fix). A backfill and
    verify read only ranges the stream judged; a record outside them (a ledger of an
    older version of the platform) gets the last watermark, the time now and the
    newest versions."""
    names = tuple(e.name for e in resolved.pipeline.enrich)
    decided = head.decisions(names, reading)
    newest, ranges = table_versions.joined_versions(spark, resolved, decided, dimension_versions)
    # Each enrichment's pins, the newest last: a record joins its range's by index.
    pins = [
        sorted({r[6 + i] for r in ranges} - {newest[i]}) + [newest[i]] for i in range(len(names))
    ]
    slots = [(*r[:6], *(pins[i].index(r[6 + i]) for i in range(len(names)))) for r in ranges]
    last = head.watermark_ms
    schema = "r_topic string, r_partition int, r_begin long, r_end long, r_watermark long, "
    schema += ", ".join(["r_time long", *(f"r_dim{i} long" for i in range(len(names)))])
    joined = enrichment.in_ranges(spark, raw, slots, schema)
    now = F.unix_millis(F.current_timestamp())
    columns: list[Column | str] = [
        *raw.columns,
        F.coalesce(F.col("r_time"), now).alias(BATCH_TIME_COLUMN),
        *(
            F.coalesce(F.col(f"r_dim{i}"), F.lit(len(pins[i]) - 1)).alias(enrichment.slot_column(i))
            for i in range(len(names))
        ),
    ]
    if resolved.pipeline.window is not None:
        watermark = F.coalesce(F.col("r_watermark"), F.lit(last).cast("long"))
        columns.append(watermark.alias(WATERMARK_COLUMN))
    judged = joined.select(*columns)
    for i in range(len(names)):
        tables = enrichment.at_pins(spark, resolved, i, pins[i])
        judged = judged.join(F.broadcast(tables), enrichment.slot_column(i), "left")
    return judged


def archived_records(
    spark: SparkSession,
    layout: AppLayout,
    start: kafka_offsets.Offsets,
    end: kafka_offsets.Offsets,
) -> DataFrame:
    """Records [start, end) per partition from the ``raw`` table, as Kafka rows, read
    by Spark (delta-spark) at the table's current version (the archive can be far
    larger than the driver's memory)."""
    path = layout.table("raw")
    archive = DeltaTable(str(path))
    wanted = sum(max(0, stop - start.get(tp, 0)) for tp, stop in end.items())
    if not archive.file_uris():
        if wanted:
            raise ConfigError(f"the raw archive has none of the {wanted} offsets to recompute")
        return spark.createDataFrame([], spark_kafka.COLUMNS)
    # Values can be large: small columnar batches keep a task's memory in bounds.
    spark.conf.set("spark.sql.parquet.columnarReaderBatchSize", "256")
    raw = spark.read.format("delta").option("versionAsOf", archive.version()).load(str(path))
    ledger_now = current_ledger(layout)
    deleted_logs = (
        [] if ledger_now is None else sorted(current_log_history(layout, ledger_now).excluded)
    )
    if deleted_logs:  # their offsets are positions in a log that is gone, not this one's
        raw = raw.filter(~F.col("epoch").isin(deleted_logs))
    ranges = [
        (F.col("topic") == topic)
        & (F.col("partition") == part)
        & (F.col("offset") >= start.get((topic, part), 0))
        & (F.col("offset") < stop)
        for (topic, part), stop in end.items()
    ]
    selected = raw.filter(functools.reduce(lambda a, b: a | b, ranges)) if ranges else raw.limit(0)
    # A cheap pass (three columns): every partition to recompute must be archived.
    found = {
        (r["topic"], r["partition"])
        for r in selected.groupBy("topic", "partition").count().collect()
    }
    missing = sorted(tp for tp, stop in end.items() if stop > start.get(tp, 0) and tp not in found)
    if missing:
        raise ConfigError(
            f"the raw archive has no records of {missing} in the range to recompute; "
            "backfill from Kafka (--source kafka) if it still holds them"
        )
    # One row per offset even if a range was archived in two epochs (after a rewind).
    # Fewer rows than offsets is normal for transactional topics (markers take offsets).
    return selected.dropDuplicates(["topic", "partition", "offset"]).select(
        "key", "value", "topic", "partition", "offset", "timestamp", "timestampType"
    )


def preview(
    pipeline: Pipeline,
    current: pa.Table,
    corrected: pa.Table,
    same: Callable[[Any, Any], bool] = operator.eq,
) -> dict[str, Any]:
    """Rows of ``corrected`` against ``current`` by key: changed, added, removed
    (``same`` decides whether two values are equal). The samples are the largest
    changes of the first aggregation; ``differences`` holds a histogram of
    after - before per aggregation (a key added or removed counts from 0)."""
    keys = list(pipeline.state_keys)
    values = [a.name for a in pipeline.aggregations]
    before = current.select(keys + values).rename_columns(keys + [f"{v}__before" for v in values])
    joined = corrected.select(keys + values).join(before, keys=keys, join_type="full outer")
    changed_rows = []
    deltas: dict[str, list[float]] = {v: [] for v in values}
    added = removed = 0
    for row in joined.to_pylist():
        new = {v: row[v] for v in values}
        old = {v: row[f"{v}__before"] for v in values}
        if all(x is None for x in old.values()):
            added += 1
        elif all(x is None for x in new.values()):
            removed += 1
        elif all(same(new[v], old[v]) for v in values):
            continue
        for v in values:
            deltas[v].append(_number(new[v]) - _number(old[v]))
        changed_rows.append({**{k: str(row[k]) for k in keys}, "before": old, "after": new})
    first = values[0]
    order = sorted(range(len(changed_rows)), key=lambda i: -abs(deltas[first][i]))
    totals = {
        v: {
            "before": _total(current, v),
            "after": _total(corrected, v),
        }
        for v in values
    }
    return {
        "rows_before": current.num_rows,
        "rows_after": corrected.num_rows,
        "keys_changed": len(changed_rows) - added - removed,
        "keys_added": added,
        "keys_removed": removed,
        "totals": totals,
        "samples": [changed_rows[i] for i in order[:SAMPLES]],
        "differences": {v: h for v, d in deltas.items() if (h := histogram(d)) is not None},
    }


def _total(rows: pa.Table, name: str) -> Any:
    """The column's sum (0 without rows; None for a min/max of text or time)."""
    kind = rows.schema.field(name).type
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind)):
        return None
    return pc.sum(rows[name]).as_py() if rows.num_rows else 0


def _number(value: Any) -> float:
    """An aggregate as a number for a difference (absent: 0; min/max of a timestamp
    or a string: 0, as they have no difference)."""
    if isinstance(value, int | float | Decimal) and not isinstance(value, bool):
        return float(value)
    return 0.0


def histogram(values: list[float], bins: int = 30) -> dict[str, list[float]] | None:
    """Counts per bin of the finite values (None: there are none)."""
    finite = numpy.asarray(values, dtype=float)
    finite = finite[numpy.isfinite(finite)]
    if not finite.size:
        return None
    counts, edges = numpy.histogram(finite, bins=bins)
    return {"edges": [float(e) for e in edges], "counts": [int(c) for c in counts]}


def write_preview(layout: AppLayout, plan: Plan, report: dict[str, Any]) -> Location:
    """The preview as JSON, and its plot as a PNG beside it (``report["plot"]``)."""
    from jobs.operations.preview_plot import write_plot

    name = f"preview-epoch{plan.epoch_before}-{int(time.time())}"
    path, plot = (layout.root / "_backfill" / f"{name}.{kind}" for kind in ("json", "png"))
    landing = plot.landing()
    try:
        write_plot(plan, report, landing.path)
        landing.land()
    finally:
        landing.discard()
    report["plot"] = str(plot)
    path.write_text(json.dumps({"plan": plan.to_dict(), "preview": report}, indent=2, default=str))
    return path


def summary(report: dict[str, Any]) -> str:
    totals = ", ".join(
        f"{name} {t['before']} -> {t['after']}" for name, t in report["totals"].items()
    )
    return (
        f"preview: {report['keys_changed']} keys changed, {report['keys_added']} added, "
        f"{report['keys_removed']} removed ({report['rows_before']} -> {report['rows_after']} "
        f"rows); totals: {totals}"
    )


def publish(
    resolved: Resolved,
    settings: Settings,
    plan: Plan,
    corrected: pa.Table,
    letters: pa.Table | None = None,
) -> dict[str, Any]:
    """The recomputation's dead letters appended to dead_letter (those they
    supersede go once the backfill is done: ``jobs/superseded.py``), one MERGE on
    state and one append to changelog, fenced in the new epoch."""
    pipeline = resolved.pipeline
    layout = AppLayout(settings.warehouse, pipeline.application_id)
    epoch = plan.epoch_after
    now = int(time.time() * 1_000_000)
    state_rows = _stamped(corrected, epoch, "updated_at", now)
    fence = OperationFence(
        pipeline.application_id,
        epoch,
        "backfill",
        {
            "reason": plan.reason,
            "pipeline_version": str(pipeline.version),
            "epoch_before": str(plan.epoch_before),
        },
    )
    if letters is not None and letters.num_rows:
        dead_letter = DeltaTable(str(layout.table("dead_letter")))
        write_deltalake(
            dead_letter,
            _stamped(letters, epoch, "commit_time", now).cast(tables.DEAD_LETTER_SCHEMA),
            mode="append",
            commit_properties=fence.on(dead_letter),
        )
    state_path = layout.table("state")
    before_version = DeltaTable(str(state_path)).version()
    redefined = tables.state_redefined(layout, resolved)
    if redefined:
        # The changelog first, with every row (a swap changes them all) and the new
        # columns even when there are none: a crash before the swap leaves the
        # state redefined, and the backfill run again does both.
        changelog = changelog_rows(resolved, corrected, epoch, now)
        append_new_definition(layout.table("changelog"), changelog, fence)
        maybe_crash("during_operation")
        metrics = swap_state(resolved, state_path, state_rows, fence)
        state_version = DeltaTable(str(state_path)).version()
    else:
        metrics = merge_state(pipeline, state_path, state_rows, fence)
        maybe_crash("during_operation")
        state_version = DeltaTable(str(state_path)).version()
        corrections = version_changes(layout.table("state"), state_version)
        after = rows_of(corrections, AFTER, list(resolved.aggregate_schema.names))
        changelog = changelog_rows(resolved, after, epoch, now)
        if changelog.num_rows:
            target = DeltaTable(str(layout.table("changelog")))
            write_deltalake(target, changelog, mode="append", commit_properties=fence.on(target))
    return {
        "state_version_before": before_version,
        "state_version": state_version,
        "redefined": redefined,
        "rows_updated": metrics.get("num_target_rows_updated"),
        "rows_inserted": metrics.get("num_target_rows_inserted"),
        "rows_deleted": metrics.get("num_target_rows_deleted"),
        "changelog_rows": changelog.num_rows,
        "dead_letters": 0 if letters is None else letters.num_rows,
    }


def _stamped(rows: pa.Table, epoch: int, time_column: str, now: int) -> pa.Table:
    """``rows`` with the operation's epoch, batch id -1 (written by an operation) and
    ``time_column`` at ``now`` (microseconds)."""
    n = rows.num_rows
    for name, value in (("epoch", epoch), ("batch_id", -1)):
        rows = rows.append_column(
            pa.field(name, pa.int64(), False), pa.array([value] * n, pa.int64())
        )
    field = pa.field(time_column, tables.TIMESTAMP, False)
    return rows.append_column(field, pa.array([now] * n, tables.TIMESTAMP))


def changelog_rows(resolved: Resolved, rows: pa.Table, epoch: int, now: int) -> pa.Table:
    """``rows`` (keys and aggregates) as changelog rows of the operation's epoch."""
    kept = rows.select(list(resolved.aggregate_schema.names))
    return _stamped(kept, epoch, "commit_time", now).cast(resolved.changelog_schema)


def append_new_definition(path: Location, rows: pa.Table, fence: OperationFence) -> None:
    """Append with the new definition's columns merged into the changelog's. A
    column the old files lack is nullable in the table: files without it stay
    readable and compactable."""
    table = DeltaTable(str(path))
    existing = {f.name for f in table.schema().fields}
    schema = pa.schema([f if f.name in existing else f.with_nullable(True) for f in rows.schema])
    write_deltalake(
        table,
        rows.cast(schema),
        mode="append",
        schema_mode="merge",
        commit_properties=fence.on(table),
    )


def merge_state(
    pipeline: Pipeline, path: Location, rows: pa.Table, fence: OperationFence
) -> dict[str, Any]:
    """The same definition: one MERGE that touches only the rows that change."""
    keys = " AND ".join(f"t.`{k}` = s.`{k}`" for k in pipeline.state_keys)
    changed = " OR ".join(f"NOT (t.`{v}` <=> s.`{v}`)" for v in pipeline.value_columns)
    table = DeltaTable(str(path))
    return dict(
        table.merge(
            rows, keys, source_alias="s", target_alias="t", commit_properties=fence.on(table)
        )
        .when_matched_update_all(predicate=changed)
        .when_not_matched_insert_all()
        .when_not_matched_by_source_delete()
        .execute()
    )


def swap_state(
    resolved: Resolved, path: Location, rows: pa.Table, fence: OperationFence
) -> dict[str, Any]:
    """A new definition (columns added, removed or retyped): the whole table,
    schema and rows, replaced in one commit. A reader sees the old table or the
    new one; the change data feed shows every old row deleted, every new inserted."""
    table = DeltaTable(str(path))
    before = table.to_pyarrow_dataset().count_rows()
    configuration = dict(table.metadata().configuration)
    write_deltalake(
        table,
        rows.cast(resolved.state_schema),
        mode="overwrite",
        schema_mode="overwrite",
        configuration=configuration,
        commit_properties=fence.on(table),
    )
    return {
        "num_target_rows_updated": 0,
        "num_target_rows_inserted": rows.num_rows,
        "num_target_rows_deleted": before,
    }


def same_sketches_kept(
    spark: SparkSession, pipeline: Pipeline, current: pa.Table, corrected: pa.Table
) -> pa.Table:
    """``corrected`` with the state's sketch wherever its recomputed distinct-count
    sketch holds the same values in other bytes: a sketch's bytes follow the order
    its values were merged in, which a batch job does not share with the stream, and
    that is no change (no MERGE update, no correction). Two sketches in coupon mode
    (DataSketches' LIST or SET, up to a few hundred values: the estimate counts the
    coupons) hold the same values when their union's estimate is each one's (a set
    with another value would grow it). In HLL mode an equal estimate can hide
    other registers: there only equal bytes are the same (other bytes publish a
    correction that changes no number)."""
    sketches = [
        stored_column(a) for a in pipeline.aggregations if a.function == "approx_count_distinct"
    ]
    if not sketches or not current.num_rows or not corrected.num_rows:
        return corrected
    keys = list(pipeline.state_keys)
    before = current.select(keys + sketches).rename_columns(keys + [f"{s}__now" for s in sketches])
    joined = corrected.join(before, keys=keys, join_type="left outer")
    frame = spark.createDataFrame(joined)
    columns = []
    for name in corrected.column_names:
        if name not in sketches:
            columns.append(F.col(f"`{name}`"))
            continue
        new, now = F.col(f"`{name}`"), F.col(f"`{name}__now`")
        estimate = F.hll_sketch_estimate
        same = (
            now.isNotNull()
            & new.isNotNull()
            & coupon_mode(new)
            & coupon_mode(now)
            & (estimate(F.hll_union(new, now)) == estimate(new))
            & (estimate(new) == estimate(now))
        )
        columns.append(F.when(same, now).otherwise(new).alias(name))
    return frame.select(*columns).toArrow().cast(corrected.schema)


def coupon_mode(sketch: Column) -> Column:
    """Whether a serialized DataSketches HLL sketch is in LIST or SET mode: the low
    two bits of its eighth byte, the mode byte (0 LIST, 1 SET, 2 HLL)."""
    mode = F.conv(F.hex(F.substring(sketch, 8, 1)), 16, 10).cast("int")
    return (mode % 4) < 2


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with ``schema``'s columns: one it lacks (an aggregation or key a new
    definition adds) is empty; one it has beyond them is left out."""
    columns = [
        table.column(f.name).cast(f.type)
        if f.name in table.column_names
        else pa.nulls(table.num_rows, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(columns, schema=pa.schema([f.with_nullable(True) for f in schema]))


def check_redefinition(layout: AppLayout, resolved: Resolved, plan: Plan) -> None:
    """A new definition is published only from a full recomputation, and never
    under the keys of an output topic that its readers key differently. The state
    judged is the one the backfill publishes onto (``cut.state_behind``: a dead
    backfill's swap is undone first)."""
    pipeline = resolved.pipeline
    onto = state_behind(layout)
    if not tables.state_redefined(layout, resolved, onto):
        return
    if plan.seed_state_version is not None:
        raise ConfigError(
            f"pipeline {pipeline.application_id} v{pipeline.version} changes the state's "
            "columns: a backfill from a batch boundary would build on the old ones; use "
            "--from-earliest"
        )
    old_keys = {
        f.name for f in DeltaTable(str(layout.table("state")), version=onto).schema().fields
    }
    added = [k for k in pipeline.state_keys if k not in old_keys]
    if added and pipeline.output is not None:
        raise ConfigError(
            f"pipeline {pipeline.application_id} v{pipeline.version} adds key(s) "
            f"{', '.join(added)}: the records of output topic {pipeline.output.topic} are keyed "
            "by the old keys; set output.topic to a new topic, backfill, then "
            f"python -m jobs publish --pipeline {pipeline.application_id} --snapshot"
        )


def run_backfill(
    spark: SparkSession,
    pipeline: Pipeline,
    settings: Settings,
    reason: str,
    start: TargetSpec,
    source: str = "kafka",
    preview_only: bool = False,
    echo: Callable[[str], None] = print,
    plan_id: str | None = None,
    save_as: str | None = None,
    dimensions_from: str = "recorded",
    plan_digest: str | None = None,
    form: Form = "blue-green",
    switch_within: int = CATCH_UP_RECORDS,
) -> Plan:
    """Plan; with ``preview_only`` recompute and report (``runner.dry_run_operation``);
    else recompute (beside a running stream: ``shadow.py``), fence, publish and
    restart (``runner.run_operation``)."""
    from jobs.operations.runner import dry_run_operation, run_operation

    if preview_only and plan_id is not None:
        raise ConfigError("--plan applies a saved plan: leave out --preview")
    resolved = analyser.resolve(spark, pipeline, settings.warehouse)
    layout = AppLayout(settings.warehouse, pipeline.application_id)
    store(layout, resolved)  # what the plan, made without Spark, reads

    def computed(
        plan: Plan, ranges: Intervals | None, onto: Shadow | None
    ) -> tuple[pa.Table, pa.Table]:
        return recompute(
            spark, resolved, settings, plan, ranges, None if onto is None else onto.corrected
        )

    def previewed(
        plan: Plan, corrected: pa.Table, letters: pa.Table
    ) -> tuple[pa.Table, pa.Table, dict[str, Any]]:
        schema = resolved.aggregate_schema
        # Compared with the state it publishes onto (what is beyond the ledger is undone).
        onto = DeltaTable(str(layout.table("state")), version=state_behind(layout))
        current = conform(onto.to_pyarrow_table(), schema)
        corrected = same_sketches_kept(spark, pipeline, current, corrected)
        report = preview(pipeline, current, corrected)
        path = write_preview(layout, plan, report)
        echo(summary(report))
        echo(f"preview written to {path}")
        return corrected, letters, report

    def show(plan: Plan) -> dict[str, Any]:
        return {"preview": previewed(plan, *computed(plan, None, None))[2]}

    form, why = form_of(layout, plan_id is not None, form)

    def make_plan() -> Plan:
        plan = plan_backfill(pipeline, settings, reason, start, source, dimensions_from)
        if not preview_only:
            plan.notes.append(f"form: {form}: {why}")
        return plan

    # Blue/green: everything the stream judged so far, recomputed while it runs.
    shadow = (
        beside_the_stream(computed, make_plan, echo, switch_within)
        if form == "blue-green" and not preview_only
        else None
    )

    def apply(plan: Plan) -> dict[str, Any]:
        if shadow is None:
            corrected, letters = computed(plan, None, None)
        else:  # the stream is fenced now: only its last batches are left
            done = catch_up_fenced(computed, shadow, plan, echo)
            corrected, letters = done.corrected, done.letters
        corrected, letters, _report = previewed(plan, corrected, letters)
        return apply_plan(
            pipeline,
            settings,
            plan,
            corrected,
            lambda: publish(resolved, settings, plan, corrected, letters),
        )

    if not preview_only:
        return run_operation(
            pipeline,
            settings,
            make_plan,
            echo,
            apply=apply,
            plan_id=plan_id,
            operation="backfill",
            plan_digest=plan_digest,
        )
    return dry_run_operation(pipeline, settings, make_plan, echo, inspect=show, save_as=save_as)
