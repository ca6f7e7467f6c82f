"""Dimension tables joined to each record (``enrich:``), one version per batch.

A plain stream-static join reads a Delta table's newest version in every
micro-batch, so a batch replayed after a crash could join another version than
its first attempt and compute another answer. Here each batch joins the version
committed at or before its planned time (``batchTimestampMs`` in Spark's offset
log, which a replay keeps), read on the driver while the batch is planned by
``include/jvm/sources/platform/streaming/PinnedDeltaSource.java``, and the ledger
records what it read with the batch (``dimensions`` in the batch row's details): the
table's id (Delta's ``metaData.id``), its location and the version, a ``Pin``.

A table arrives as one row per enrichment: its version, and per key (as a
string) the rows with that key, cross-joined (broadcast) to the batch's records.
A key with more than one row is its records' dead letter, never a double count; a
key with none is a dead letter or a NULL struct (``missing: keep``).

A replay through new batches (a rewind that reprocesses, a rebuild from the
source) reads records that earlier batches judged: those join the tables the
earlier judgment recorded (``replayed``): the same table, at the location it was
read from, at the same version; one error when that version is gone or another table
(another id) is there now. The batch records which ranges did.
"""

from __future__ import annotations

import json
from typing import Any

from deltalake import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, MapType, StringType, StructType

from jobs.coverage import Pin
from jobs.cut import check_readable, current_log_history, table_id
from jobs.delta.layout import AppLayout
from jobs.dimension import ROW_JSON_OPTIONS
from jobs.errors import ConfigError
from jobs.kafka_source.offsets import Offsets
from jobs.ledger import snapshot
from jobs.pipeline import Pipeline
from jobs.resolved import DimensionTable, Resolved
from jobs.settings import load_settings
from jobs.streaming import offset_log

FORMAT = "platform.streaming.PinnedDeltaSource"
PREFIX = "_dim"


def row_type(table: DimensionTable) -> StructType:
    """The table's columns as the run was checked with (``records.resolve``)."""
    return StructType.fromJson(json.loads(table.row_type))


def version_column(i: int) -> str:
    return f"{PREFIX}{i}_version"


def rows_column(i: int) -> str:
    return f"{PREFIX}{i}_rows"


def table_column(i: int) -> str:
    """The table id the batch's join read (with ``version_column``: what it records)."""
    return f"{PREFIX}{i}_table"


def slot_column(i: int) -> str:
    """Which of the pins ``at_pins`` read a record joins (its index)."""
    return f"{PREFIX}{i}_slot"


def pinned(spark: SparkSession, resolved: Resolved, checkpoint: str) -> list[DataFrame]:
    """Per enrichment, one row: the version of its table the running batch joins
    (``checkpoint``'s newest offset log entry's planned time), and its rows by key."""
    return [
        F.broadcast(_by_key(spark, resolved, i, {"checkpoint": checkpoint}))
        for i in range(len(resolved.pipeline.enrich))
    ]


def at_pins(spark: SparkSession, resolved: Resolved, i: int, pins: list[Pin]) -> DataFrame:
    """Enrichment ``i``'s tables as ``pins`` name them (a pin without a location: the
    enrichment's table now): a row per pin, its index (``slot_column``) and its rows
    by key, to join to records by the pin they need."""
    if not pins:
        raise ConfigError(f"{resolved.application_id}: no version of enrichment {i} to read")
    frames = [
        _by_key(spark, resolved, i, {"version": str(pin.version)}, pin.path).select(
            F.lit(slot).cast("long").alias(slot_column(i)), rows_column(i)
        )
        for slot, pin in enumerate(pins)
    ]
    union = frames[0]
    for frame in frames[1:]:
        union = union.unionByName(frame)
    return union


def replay_ranges(
    spark: SparkSession, resolved: Resolved, layout: AppLayout, cut: Offsets
) -> list[tuple[Any, ...]]:
    """The ranges at or after ``cut`` (the epoch's; from its last ledger batch on, the
    one batch Spark may run again, unless its own commit log holds it) that earlier
    batches judged, merged, with the tables a replay joins there."""
    snap = snapshot(layout) if resolved.pipeline.enrich else None
    if snap is None:
        return []
    history = current_log_history(layout, snap)
    names = tuple(e.name for e in resolved.pipeline.enrich)
    committed = offset_log.committed_batches(layout.checkpoint(history.epoch))
    reading_from = history.replay_from(cut, committed[-1] if committed else None)
    decisions = history.replay_decisions(reading_from, names)
    if not decisions:
        return []
    _newest, ranges = joined_versions(spark, resolved, decisions)
    return merged(ranges, len(names))


def joined_versions(
    spark: SparkSession,
    resolved: Resolved,
    ranges: list[tuple[Any, ...]],
    chosen: dict[str, Pin] | None = None,
) -> tuple[list[Pin], list[tuple[Any, ...]]]:
    """Each enrichment's table for records outside ``ranges`` (its newest version, or
    the chosen pin), and ``ranges`` (``Coverage.decisions``) with the pin each range
    joins: the one its batch recorded (a batch from before the enrichment, of a
    pipeline version without it: the version the stream would have joined at its
    time, or the table's oldest one if it did not exist yet), or the ``chosen`` one.
    A table that can no longer be read as recorded is one error naming it."""
    newest_pins: list[Pin] = []
    filled = [list(r) for r in ranges]
    for i, e in enumerate(resolved.pipeline.enrich):
        path = resolved.dimensions[e.name].path
        kept = history(spark, path)
        picked = (chosen or {}).get(e.name)
        known: dict[int, Pin] = {}  # one read of the log per version, however many ranges

        def pin_at(version: int, path: str = path, known: dict[int, Pin] = known) -> Pin:
            if version not in known:
                known[version] = current_pin(path, version)
            return known[version]

        newest_pins.append(picked or pin_at(max(v for v, _ms in kept)))
        for r in filled:
            if picked is not None:
                r[6 + i] = picked
            elif r[6 + i] is None:
                at_its_time = version_at(kept, int(r[5]))
                r[6 + i] = pin_at(min(v for v, _ms in kept) if at_its_time is None else at_its_time)
        check_readable(resolved.application_id, e.name, path, {r[6 + i] for r in filled})
    return newest_pins, [tuple(r) for r in filled]


def current_pin(path: str, version: int) -> Pin:
    """The table at ``path`` now, at ``version``."""
    return Pin(version, table_id(path, version) or "", path)


def newest_pin(path: str) -> Pin:
    """The table at ``path`` at its newest version (one error: no table there)."""
    try:
        version = DeltaTable(path).version()
    except Exception as e:
        raise ConfigError(f"no dimension table at {path} ({e}): load it first") from None
    return current_pin(path, version)


def merged(ranges: list[tuple[Any, ...]], count: int) -> list[tuple[Any, ...]]:
    """``joined_versions`` ranges as (topic, partition, begin, end, *versions), adjacent ones
    with the same versions as one (a replay's join then looks through a few ranges
    per partition, not one per batch)."""
    out: list[list[Any]] = []
    for r in sorted(ranges):
        versions = list(r[6 : 6 + count])
        last = out[-1] if out else None
        if last and last[:2] == list(r[:2]) and last[3] == r[2] and last[4:] == versions:
            last[3] = r[3]
        else:
            out.append([r[0], r[1], r[2], r[3], *versions])
    return [tuple(r) for r in out]


def replayed(
    spark: SparkSession, resolved: Resolved, frame: DataFrame, ranges: list[tuple[Any, ...]]
) -> DataFrame:
    """``frame`` (records with the batch's pinned tables) where a record lies in one
    of ``ranges`` (``merged``: judged before) joins the rows of the tables recorded
    there instead of the batch's; ``_dim<i>_version`` stays the batch's."""
    if not ranges:
        return frame
    count = len(resolved.pipeline.enrich)
    pins = [sorted({r[4 + i] for r in ranges}) for i in range(count)]
    slots = [(*r[:4], *(pins[i].index(r[4 + i]) for i in range(count))) for r in ranges]
    schema = "r_topic string, r_partition int, r_begin long, r_end long"
    schema += "".join(f", r_dim{i} long" for i in range(count))
    joined = in_ranges(spark, frame, slots, schema)
    for i in range(count):
        tables = at_pins(spark, resolved, i, pins[i]).select(
            F.col(slot_column(i)).alias(f"r_v{i}"), F.col(rows_column(i)).alias(f"r_rows{i}")
        )
        joined = joined.join(F.broadcast(tables), F.col(f"r_dim{i}") == F.col(f"r_v{i}"), "left")
        recorded = F.when(F.col(f"r_dim{i}").isNotNull(), F.col(f"r_rows{i}"))
        joined = joined.withColumn(rows_column(i), recorded.otherwise(F.col(rows_column(i))))
    return joined.select(*frame.columns)


def in_ranges(
    spark: SparkSession, frame: DataFrame, rows: list[tuple[Any, ...]], schema: str
) -> DataFrame:
    """``frame``'s records left-joined to the row of ``rows`` (topic, partition,
    [begin, end), then what the range holds) their offset lies in."""
    known = spark.createDataFrame(rows, schema)
    matches = (
        (F.col("topic") == F.col("r_topic"))
        & (F.col("partition") == F.col("r_partition"))
        & (F.col("offset") >= F.col("r_begin"))
        & (F.col("offset") < F.col("r_end"))
    )
    return frame.join(F.broadcast(known), matches, "left")


def pieces(
    ranges: list[tuple[Any, ...]], names: list[str], start: Offsets, end: Offsets
) -> list[list[Any]]:
    """The parts of ``merged`` ranges a batch [start, end) read, with the pins (of
    the enrichments ``names``) recorded there: as the ledger keeps them
    (``replayed`` in the batch row's details, each pin ``Pin.to_json``)."""
    found = []
    for topic, part, begin, stop, *versions in ranges:
        low = max(begin, start.get((topic, part), end.get((topic, part), 0)))
        high = min(stop, end.get((topic, part), low))
        if low < high:
            found.append([topic, part, low, high, dict(zip(names, versions, strict=True))])
    return found


def _by_key(
    spark: SparkSession, resolved: Resolved, i: int, options: dict[str, str], path: str = ""
) -> DataFrame:
    enrichment = resolved.pipeline.enrich[i]
    table = resolved.dimensions.get(enrichment.name)
    if table is None:
        raise ConfigError(f"{resolved.application_id}: enrich {enrichment.name!r} unresolved")
    raw = (
        spark.read.format(FORMAT)
        .option("path", path or table.path)
        .option("schema", table.row_type)
        .option("key", enrichment.table_key)
        .option("maxBytes", str(load_settings().dimension_max_bytes))
        .options(**options)
        .load()
    )
    # The source writes timestamps to the microsecond (Spark's default JSON has ms),
    # and the rows by key (the key as Spark casts it to a string): one row, no shuffle.
    formats = ROW_JSON_OPTIONS
    by_key = MapType(StringType(), ArrayType(row_type(table)))
    return raw.select(
        F.col("_dim_version").alias(version_column(i)),
        F.col("_dim_table").alias(table_column(i)),
        F.from_json(F.col("_dim_row"), by_key.json(), formats).alias(rows_column(i)),
    )


def history(spark: SparkSession, path: str) -> list[tuple[int, int]]:
    """(version, commit time in ms) of the table's kept versions, as the stream's
    source chooses from them (``PinnedDeltaSource.versionAt``)."""
    table = "delta.`" + path.replace("`", "``") + "`"
    rows = spark.sql(f"DESCRIBE HISTORY {table}").selectExpr(
        "version", "unix_millis(timestamp) AS ms"
    )
    return sorted((int(r["version"]), int(r["ms"])) for r in rows.collect())


def version_at(versions: list[tuple[int, int]], time_ms: int) -> int | None:
    """The newest version committed at or before ``time_ms`` (the stream's rule;
    None: the table's kept history starts later)."""
    found = [v for v, ms in versions if ms <= time_ms]
    return max(found) if found else None


def enriched(frame: DataFrame, pipeline: Pipeline) -> DataFrame:
    """``frame`` (the record's columns and the tables' one-row columns) with each
    enrichment's struct, and ``_e<i>`` (the rows its key matched) for the checks."""
    for i, enrichment in enumerate(pipeline.enrich):
        key = F.expr(enrichment.record_key).cast("string")  # as the source keys the rows
        matched = F.try_element_at(F.col(rows_column(i)), key)
        frame = frame.withColumn(f"_e{i}", matched)
        frame = frame.withColumn(
            enrichment.name, F.when(F.size(F.col(f"_e{i}")) == 1, F.col(f"_e{i}")[0])
        )
    return frame


def checks(resolved: Resolved) -> list[tuple[Column, Column]]:
    """Why a record cannot be enriched: its key matches several rows of a table, or
    none (unless the enrichment keeps it with a NULL struct)."""
    found: list[tuple[Column, Column]] = []
    for i, e in enumerate(resolved.pipeline.enrich):
        rows = F.col(f"_e{i}")
        value = F.coalesce(F.expr(e.record_key).cast("string"), F.lit("NULL"))
        table = resolved.dimensions.get(e.name)
        where = e.table if table is None else table.path
        found.append(
            (
                F.size(rows) > 1,
                F.concat(
                    F.lit(f"enrich {e.name}: "),
                    F.size(rows).cast("string"),
                    F.lit(f" rows of {where} have {e.table_key} = "),
                    value,
                ),
            )
        )
        if e.missing == "dead_letter":
            found.append(
                (
                    rows.isNull() | (F.size(rows) == 0),
                    F.concat(
                        F.lit(f"enrich {e.name}: no row of {where} has {e.table_key} = "), value
                    ),
                )
            )
    return found
