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

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, MapType, StringType, StructType

from jobs.dimension_load import ROW_JSON_OPTIONS
from jobs.errors import ConfigError
from jobs.lineage import Pin
from jobs.pipeline.model import Pipeline
from jobs.resolution import DimensionTable, Resolved
from jobs.settings import load_settings

FORMAT = "platform.streaming.PinnedDeltaSource"
PREFIX = "_dim"


def row_type(table: DimensionTable) -> StructType:
    """The table's columns as the run was checked with (``analyser.resolve``)."""
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


def replayed(
    spark: SparkSession, resolved: Resolved, frame: DataFrame, ranges: list[tuple[Any, ...]]
) -> DataFrame:
    """``frame`` (records with the batch's pinned tables) where a record lies in one
    of ``ranges`` (``table_versions.merged``: judged before) joins the rows of the tables recorded
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
