"""Dimension tables joined to each record (``enrich:``), one version per batch.

A plain stream-static join reads a Delta table's newest version in every
micro-batch, so a batch replayed after a crash could join another version than
its first attempt and compute another answer. Here each batch joins the version
committed at or before its planned time (``batchTimestampMs`` in Spark's offset
log, which a replay keeps), read on the driver while the batch is planned by
``include/jvm/sources/platform/streaming/PinnedDeltaSource.java``, and the ledger
records it with the batch (``dimensions`` in the batch row's details).

A table arrives as one row per enrichment: its version, and per key the rows with
that key, cross-joined (broadcast) to the batch's records. A key with more than one
row is its records' dead letter, never a double count; a key with none is a dead
letter or a NULL struct (``missing: keep``).
"""

from __future__ import annotations

import json

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from jobs.errors import ConfigError
from jobs.pipeline import DimensionTable, Pipeline

FORMAT = "platform.streaming.PinnedDeltaSource"
PREFIX = "_dim"


TIMESTAMP_FORMAT = "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX"  # as PinnedDeltaSource writes them
TIMESTAMP_NTZ_FORMAT = "yyyy-MM-dd'T'HH:mm:ss.SSSSSS"


def row_type(table: DimensionTable) -> StructType:
    """The table's columns as the run was checked with (``records.resolve``)."""
    return StructType.fromJson(json.loads(table.row_type))


def version_column(i: int) -> str:
    return f"{PREFIX}{i}_version"


def rows_column(i: int) -> str:
    return f"{PREFIX}{i}_rows"


def pinned(spark: SparkSession, pipeline: Pipeline, checkpoint: str) -> list[DataFrame]:
    """Per enrichment, one row: the version of its table the running batch joins
    (``checkpoint``'s newest offset log entry's planned time), and its rows by key."""
    return [
        F.broadcast(_by_key(spark, pipeline, i, {"checkpoint": checkpoint}))
        for i in range(len(pipeline.enrich))
    ]


def at_versions(spark: SparkSession, pipeline: Pipeline, i: int, versions: set[int]) -> DataFrame:
    """Enrichment ``i``'s table at each of ``versions``: a row per version (its
    version and rows by key), to join to records by the version they need."""
    frames = [_by_key(spark, pipeline, i, {"version": str(v)}) for v in sorted(versions)]
    if not frames:
        raise ConfigError(f"{pipeline.application_id}: no version of enrichment {i} to read")
    union = frames[0]
    for frame in frames[1:]:
        union = union.unionByName(frame)
    return union


def _by_key(spark: SparkSession, pipeline: Pipeline, i: int, options: dict[str, str]) -> DataFrame:
    enrichment = pipeline.enrich[i]
    table = pipeline.dimensions.get(enrichment.name)
    if table is None:
        raise ConfigError(f"{pipeline.application_id}: enrich {enrichment.name!r} unresolved")
    raw = (
        spark.read.format(FORMAT)
        .option("path", table.path)
        .option("schema", table.row_type)
        .option("key", enrichment.table_key)
        .options(**options)
        .load()
    )
    # The source writes timestamps to the microsecond (Spark's default JSON has ms).
    formats = {"timestampFormat": TIMESTAMP_FORMAT, "timestampNTZFormat": TIMESTAMP_NTZ_FORMAT}
    row = F.from_json(F.col("_dim_row"), row_type(table), formats)
    parsed = raw.select(F.col("_dim_version").alias("v"), row.alias("r"))
    key = F.col("r").getField(enrichment.table_key)
    per_key = parsed.groupBy(key.alias("k")).agg(
        F.max("v").alias("v"), F.collect_list("r").alias("rows")
    )
    entries = F.filter(F.collect_list(F.struct("k", "rows")), lambda e: e["k"].isNotNull())
    return per_key.agg(
        F.max("v").alias(version_column(i)), F.map_from_entries(entries).alias(rows_column(i))
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
    """The newest version committed at or before ``time_ms`` (the stream's rule)."""
    found = [v for v, ms in versions if ms <= time_ms]
    return max(found) if found else None


def enriched(frame: DataFrame, pipeline: Pipeline) -> DataFrame:
    """``frame`` (the record's columns and the tables' one-row columns) with each
    enrichment's struct, and ``_e<i>`` (the rows its key matched) for the checks."""
    for i, enrichment in enumerate(pipeline.enrich):
        matched = F.try_element_at(F.col(rows_column(i)), F.expr(enrichment.record_key))
        frame = frame.withColumn(f"_e{i}", matched)
        frame = frame.withColumn(
            enrichment.name, F.when(F.size(F.col(f"_e{i}")) == 1, F.col(f"_e{i}")[0])
        )
    return frame


def checks(pipeline: Pipeline) -> list[tuple[Column, Column]]:
    """Why a record cannot be enriched: its key matches several rows of a table, or
    none (unless the enrichment keeps it with a NULL struct)."""
    found: list[tuple[Column, Column]] = []
    for i, e in enumerate(pipeline.enrich):
        rows = F.col(f"_e{i}")
        value = F.coalesce(F.expr(e.record_key).cast("string"), F.lit("NULL"))
        table = pipeline.dimensions.get(e.name)
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
