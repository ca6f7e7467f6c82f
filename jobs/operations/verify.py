"""``verify``: recompute the state in batch and compare it with the published one.

The recomputation covers exactly the records the published state is made of: the
judged intervals of its coverage (``jobs/lineage.py``). So records a rewind
skipped stay out, and a range replayed after a rewind counts once.

The comparison is with the ``state`` table at its newest version before any
batch the ledger does not hold yet: a stream committing next to verify is left
out, a change made by hand after the last batch is drift. With the current
pipeline version and no bug, no key differs (floating-point aggregates within a
relative 1e-9: Spark sums in another order). The result goes into the ledger;
differing keys fail the command (one ``error:`` line) after printing examples.

``--sample F`` recomputes and compares only keys whose hash falls in the fraction
F (all windows of a sampled key).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.audit import append_audit, audit_row
from jobs.cut import current_log_history, floor_note, lineage_head, log_floor
from jobs.delta.layout import AppLayout
from jobs.errors import ConfigError, ConsistencyError
from jobs.ledger import (
    LedgerVersion,
    current_ledger,
    last_boundary,
    unfinished_operation,
)
from jobs.lineage import Boundary, Intervals, layers
from jobs.operations.backfill import aggregate_records, preview, read_records
from jobs.output.changes import commit_infos
from jobs.pipeline.model import Pipeline
from jobs.progress import SparkJobProgress
from jobs.resolution import Resolved, store
from jobs.settings import Settings
from jobs.streaming.analyser import resolve
from jobs.warehouse import Location

log = logging.getLogger(__name__)
VERIFY = "verify"
SAMPLE_BUCKETS = 1_000_000


def sampled(pipeline: Pipeline, fraction: float | None) -> Callable[[DataFrame], DataFrame] | None:
    """Keeps the rows of keys whose hash falls in ``fraction`` (the same keys in the
    recomputation and in the published state)."""
    if fraction is None or fraction >= 1:
        return None
    keys = [F.col(k) for k in pipeline.keys]
    bucket = F.pmod(F.xxhash64(*keys), F.lit(SAMPLE_BUCKETS))
    threshold = int(fraction * SAMPLE_BUCKETS)
    return lambda frame: frame.filter(bucket < threshold)


def comparable_version(layout: AppLayout, base_version: int, epoch: int) -> int:
    """The newest state version that the ledger (read at ``epoch``) accounts for:
    every commit after ``base_version`` up to the first batch of this epoch the
    ledger read does not hold (one committed next to verify, or one a crash left,
    which the next run undoes), or the first commit of a later epoch (an operation
    that began after the read). Commits that are not batches (maintenance, an edit
    by hand) are included."""
    current = DeltaTable(str(layout.table("state"))).version()
    if current <= max(base_version, 0):
        return current
    infos = commit_infos(layout.table("state"), base_version + 1, current)
    # An older epoch's batch (a fenced stream's last merge) was undone or overwritten
    # by the operation that started this epoch: only this epoch's count.
    unaccounted = [
        v
        for v, info in infos.items()
        if (info.get("platform_operation") == "batch" and str(info.get("epoch")) == str(epoch))
        or _epoch_of(info) > epoch
    ]
    return min(unaccounted) - 1 if unaccounted else current


def _epoch_of(info: dict[str, Any]) -> int:
    try:
        return int(info.get("epoch", -1))
    except (TypeError, ValueError):
        return -1


def state_lineage(ledger_now: LedgerVersion) -> tuple[str, int, Intervals, Boundary | None]:
    """What the published state stands for as of one read of the ledger: a
    description, the state version its lineage was committed at (or after), the
    offsets it judged (its coverage, skipped ranges left out), and the boundary
    whose state holds a recreated topic's deleted log (taken as it is: no broker
    can replay it)."""
    layout = ledger_now.layout
    unfinished = unfinished_operation(layout, ledger_now)
    if unfinished is not None:
        raise ConsistencyError(
            f"{layout.application_id}: {unfinished.describe()}; verify after it is completed"
        )
    history = current_log_history(layout, ledger_now)
    floor = log_floor(layout, ledger_now)
    judged = (
        history.head.judged()
        if floor is None
        else history.head.excluding(history.coverage_at(floor))
    )
    boundary = last_boundary(layout, ledger_now)
    epoch = ledger_now.epoch
    if boundary is not None and boundary.epoch == epoch:
        return f"epoch {epoch} batch {boundary.batch_id}", boundary.state_version, judged, floor
    if epoch in ledger_now.history().steps:  # an operation started this epoch; no batch of it yet
        head = lineage_head(layout, ledger_now)
        base = -1 if head is None else head.state_version
        return f"epoch {epoch} as its operation began it", base, judged, floor
    raise ConfigError(f"{layout.application_id} has no committed batch: nothing to verify")


def close(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return bool(a == b)


def run_verify(
    spark: SparkSession,
    pipeline: Pipeline,
    settings: Settings,
    sample: float | None = None,
    source: str = "kafka",
    echo: Callable[[str], None] = print,
) -> dict[str, Any]:
    if sample is not None and not 0 < sample <= 1:
        raise ConfigError(f"--sample must be a fraction in (0, 1], got {sample}")
    if source == "archive" and not pipeline.archive:
        raise ConfigError(f"{pipeline.application_id} keeps no raw archive (archive: false)")
    resolved = resolve(spark, pipeline, settings.warehouse)
    layout = AppLayout(settings.warehouse, pipeline.application_id)
    store(layout, resolved)  # refuses a definition computed with other SQL settings
    if not DeltaTable.is_deltatable(str(layout.table("state"))):
        raise ConfigError(f"{pipeline.application_id} has no state table: nothing to verify")
    # One read of the ledger: the lineage, the base version and the epoch agree
    # (a batch committed meanwhile is in none of them).
    ledger_now = current_ledger(layout)
    if ledger_now is None:
        raise ConfigError(f"{pipeline.application_id} has no ledger: nothing to verify")
    where, base_version, intervals, floor = state_lineage(ledger_now)
    seed = None if floor is None else floor.state_version
    reads = layers(intervals)
    records = sum(end - start for spans in intervals.values() for start, end in spans)
    echo(
        f"verify {pipeline.application_id} v{pipeline.version}: the state as of {where}, "
        f"recomputed from {records} offsets in {len(reads)} read(s)"
        + (f", keys sampled: {sample}" if sample is not None and sample < 1 else "")
        + ("" if floor is None else f"; {floor_note(floor)}")
    )
    keep = sampled(pipeline, sample)
    recomputed = _recompute(spark, resolved, settings, source, ledger_now, intervals, seed, keep)
    version = comparable_version(layout, base_version, ledger_now.epoch)
    current = _published(spark, layout.table("state"), version, resolved.aggregate_schema, keep)
    report = preview(pipeline, current, recomputed, same=close)
    differing = report["keys_changed"] + report["keys_added"] + report["keys_removed"]
    result = {
        "sample": sample,
        "as_of": where,
        "state_version": version,
        "rows_compared": max(report["rows_before"], report["rows_after"]),
        "differing_keys": differing,
        "examples": report["samples"],
    }
    append_audit(
        layout,
        audit_row(pipeline, VERIFY, ledger_now.epoch, {"reason": "drift check", **result}),
    )
    echo(
        f"verify: {result['rows_compared']} rows compared, {differing} differ "
        f"({report['keys_changed']} changed, {report['keys_added']} only recomputed, "
        f"{report['keys_removed']} only published)"
    )
    for example in report["samples"]:
        echo(f"  {json.dumps(example, sort_keys=True, default=str)}")
    if differing:
        raise ConsistencyError(
            f"{differing} key(s) of {pipeline.application_id} differ from a recomputation "
            f"with pipeline version {pipeline.version} (examples above, and in the ledger); "
            f"repair: python -m jobs backfill --pipeline {pipeline.application_id} "
            "--from-earliest --reason ... --preview"
        )
    return result


def _recompute(
    spark: SparkSession,
    resolved: Resolved,
    settings: Settings,
    source: str,
    ledger_now: LedgerVersion,
    intervals: Intervals,
    seed: int | None,
    keep: Callable[[DataFrame], DataFrame] | None,
) -> pa.Table:
    """The state recomputed in one batch job: the floor's seed (if any) plus every
    record the lineage judged, read in layers."""
    raw: DataFrame | None = None
    for start, end in layers(intervals):
        part = read_records(spark, resolved, settings, start, end, source)
        raw = part if raw is None else raw.unionByName(part)
    if raw is None and seed is None:
        return pa.Table.from_batches([], schema=resolved.aggregate_schema)
    records = sum(end - start for spans in intervals.values() for start, end in spans)
    with SparkJobProgress(spark, "verify", records):
        if raw is None:
            raw = read_records(spark, resolved, settings, {}, {}, source)
        return aggregate_records(
            spark, resolved, settings, raw, seed, keep, ledger_now, reading=intervals
        )


def _published(
    spark: SparkSession,
    state_path: Location,
    version: int,
    schema: pa.Schema,
    keep: Callable[[DataFrame], DataFrame] | None,
) -> pa.Table:
    """The state table at ``version``, or its sampled keys (Spark filters the
    sample: only it reaches the driver)."""
    state = DeltaTable(str(state_path), version=version)
    if keep is None or not state.file_uris():
        return state.to_pyarrow_table(columns=list(schema.names))
    published = spark.read.format("delta").option("versionAsOf", version).load(str(state_path))
    return keep(published.select(*schema.names)).toArrow().cast(schema)
