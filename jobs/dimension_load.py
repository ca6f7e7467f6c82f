"""A dimension table the batch half keeps: a file of rows loaded into the Delta
table that pipelines enrich their records from (``enrich:``).

``include/dimensions/<name>.yaml`` names the file (JSON lines), the key and the
columns. ``python -m jobs dimension --dimension <name>`` (the ``dimension_<name>``
DAG) reads the file with Spark, checks it, and commits it to
``<warehouse>/dims/<name>`` as one new table version, only when its rows changed:
a stream pins one version per batch, so an unchanged file adds none.

Refused with one error, nothing written: a missing file, a line that does not
parse into the columns, a null or repeated key, rows past the streams' size
limit (``PLATFORM_DIMENSION_MAX_BYTES``), or a column whose type differs
from the table's (a stream reading the table would stop on it: give the changed
table a new name instead). A field a line leaves out is NULL.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from deltalake import DeltaTable as RsDeltaTable
from pyspark.sql import DataFrame, DataFrameWriter, SparkSession
from pyspark.sql import functions as F

from jobs import sql_text
from jobs.errors import ConfigError, LeaseLostError
from jobs.lock import Holding, table_lock
from jobs.pipeline.model import APPLICATION_ID, DIMENSIONS_DIR, WAREHOUSE
from jobs.pipeline.parser import _Reader, definition_file, load_each, parse_columns
from jobs.settings import load_settings, size_text
from jobs.warehouse import Location

log = logging.getLogger(__name__)
CORRUPT = "_corrupt_record"
# How a stream writes a table's rows as JSON (``PinnedDeltaSource``'s formats: Spark's
# default keeps milliseconds).
TIMESTAMP_FORMAT = "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX"
TIMESTAMP_NTZ_FORMAT = "yyyy-MM-dd'T'HH:mm:ss.SSSSSS"
ROW_JSON_OPTIONS = {"timestampFormat": TIMESTAMP_FORMAT, "timestampNTZFormat": TIMESTAMP_NTZ_FORMAT}


@dataclass(frozen=True)
class Dimension:
    name: str
    description: str
    source: str  # a JSON-lines file: an absolute path or "${warehouse}/..."
    key: str
    columns: dict[str, str]  # column -> Spark SQL type (normalized)
    schedule_minutes: int | None  # None: only when triggered

    def table(self, warehouse: Location) -> Location:
        return warehouse / DIMENSIONS_DIR / self.name

    def source_file(self, warehouse: Location) -> Location:
        if self.source.startswith(WAREHOUSE + "/"):
            return warehouse / self.source[len(WAREHOUSE) + 1 :]
        return Location.parse(self.source, f"dimension {self.name}'s source")

    def ddl(self) -> str:
        return ", ".join(f"`{c}` {kind}" for c, kind in self.columns.items())


@dataclass(frozen=True)
class Refreshed:
    version: int
    rows: int
    changed: bool


def parse_dimension(data: object, origin: str) -> Dimension:
    top = _Reader(origin, data)
    name = top.get("name", str)
    if not APPLICATION_ID.fullmatch(name):
        raise top.error(f"must be lower case letters, digits and '_', got {name!r}", "name")
    description = top.get("description", str, "")
    source = top.get("source", str)
    rest = source[len(WAREHOUSE) :] if source.startswith(WAREHOUSE + "/") else source
    if (
        not rest.startswith("/")
        or "${" in rest
        or ".." in rest.split("/")
        or any(c in rest for c in "*?[]{}:\\")
    ):
        raise top.error(
            f"must be an absolute path or start with {WAREHOUSE}/ (no '..', no glob or "
            f"scheme characters * ? [ ] {{ }} : \\), got {source!r}",
            "source",
        )
    key = top.get("key", str)
    columns = parse_columns(top, "columns", set())
    if key not in columns:
        raise top.error(f"{key!r} is not one of the columns ({', '.join(columns)})", "key")
    if not sql_text.is_atomic(columns[key]):
        raise top.error(f"{key!r} is a {columns[key]}: a key must be a single value", "key")
    minutes = top.get("schedule_minutes", int, None)
    if minutes is not None and not 1 <= minutes <= 7 * 24 * 60:
        raise top.error(f"must be 1..10080 minutes, got {minutes}", "schedule_minutes")
    top.finish()
    return Dimension(name, description, source, key, columns, minutes)


def load_dimension(name_or_path: str, dimensions_dir: Path) -> Dimension:
    """A dimension by name (``merchants``) or by path to its YAML file."""
    path, data = definition_file(name_or_path, dimensions_dir, "dimension")
    dimension = parse_dimension(data, str(path))
    if dimension.name != path.stem:
        # The DAG and the command find a dimension by its file's name.
        raise ConfigError(
            f"{path}: name: must be the file's name {path.stem!r}, got {dimension.name!r}"
        )
    return dimension


def load_each_dimension(dimensions_dir: Path) -> tuple[list[Dimension], dict[str, ConfigError]]:
    return load_each(dimensions_dir, load_dimension)


def refresh(spark: SparkSession, dimension: Dimension, warehouse: Location) -> Refreshed:
    """Read the file, check it, and commit it as the table's next version when its
    rows differ from the current version's."""
    source = dimension.source_file(warehouse)
    rows = read_checked(spark, dimension, source)
    try:
        # One loader at a time (Delta-spark's log stores are single-writer).
        table = dimension.table(warehouse)
        with table_lock(table, f"dimension --dimension {dimension.name}") as held:
            fence_ahead_of_table(held, dimension, table)
            return _commit(spark, dimension, warehouse, rows.drop(CORRUPT), rows.count(), held)
    finally:
        # Spark matches a cache by plan: the next read of the same file must not hit it.
        rows.unpersist()


def read_checked(spark: SparkSession, dimension: Dimension, source: Location) -> DataFrame:
    """The file's rows (cached), each line parsed into the columns, one per key."""
    if source.stat() is None:
        raise ConfigError(
            f"dimension {dimension.name}: no source file {source} "
            "(the sample: python -m include.sample_data merchants)"
        )
    rows = (
        spark.read.schema(f"{dimension.ddl()}, {CORRUPT} string")
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", CORRUPT)
        .json(source.spark_uri)
        .cache()
    )
    try:
        return _checked(rows, dimension, f"dimension {dimension.name}: {source}")
    except BaseException:
        rows.unpersist()
        raise


def _checked(rows: DataFrame, dimension: Dimension, where: str) -> DataFrame:
    key = F.col(f"`{dimension.key}`")
    # What a stream keeps of the table (``PinnedDeltaSource``: the rows as JSON by
    # key, timestamps to the microsecond), measured the same way: a table past the
    # streams' limit is refused here, before it is written.
    row_json = F.to_json(F.struct(*[F.col(f"`{c}`") for c in dimension.columns]), ROW_JSON_OPTIONS)
    checks = rows.agg(
        F.sum(F.octet_length(row_json) + F.octet_length(key.cast("string")) + 6).alias("bytes"),
        F.count(F.lit(1)).alias("rows"),
        F.count_if(F.col(CORRUPT).isNotNull()).alias("corrupt"),
        F.min(F.when(F.col(CORRUPT).isNotNull(), F.col(CORRUPT))).alias("example"),
        F.count_if(key.isNull() & F.col(CORRUPT).isNull()).alias("null_keys"),
        F.countDistinct(key).alias("keys"),
    ).first()
    assert checks is not None
    if checks["corrupt"]:
        example = str(checks["example"])[:120]
        raise ConfigError(
            f"{where}: {checks['corrupt']} line(s) do not parse into the columns "
            f"({dimension.ddl()}), e.g. {example!r}; nothing was written"
        )
    if checks["null_keys"]:
        raise ConfigError(f"{where}: {checks['null_keys']} row(s) with no {dimension.key}")
    limit = load_settings().dimension_max_bytes
    if (checks["bytes"] or 0) > limit:
        raise ConfigError(
            f"{where}: its rows are about {size_text(checks['bytes'])} as JSON, past "
            f"PLATFORM_DIMENSION_MAX_BYTES ({size_text(limit)}): a stream joining it "
            "would stop. Nothing was written: make the file smaller, or raise the limit "
            "(and PLATFORM_SPARK_DRIVER_MEMORY with it) where the loader and the streams run"
        )
    if checks["keys"] != checks["rows"]:
        repeated = rows.groupBy(key.alias("k")).count().where("count > 1").orderBy("k").first()
        assert repeated is not None
        raise ConfigError(
            f"{where}: {dimension.key} {repeated['k']!r} is on {repeated['count']} rows "
            "(a key names one row; a record joined to it would be a dead letter)"
        )
    return rows


def _commit(
    spark: SparkSession,
    dimension: Dimension,
    warehouse: Location,
    data: DataFrame,
    count: int,
    held: Holding,
) -> Refreshed:
    where = f"dimension {dimension.name}: {dimension.source_file(warehouse)}"
    table = dimension.table(warehouse)
    target = "delta.`" + table.spark_uri.replace("`", "``") + "`"
    if not (table / "_delta_log").is_dir():
        held.check()
        fenced(data.write.format("delta"), dimension, held).save(table.spark_uri)
        return Refreshed(0, count, True)
    current = spark.read.format("delta").load(table.spark_uri)
    changed_types = [
        f"{f.name} ({current.schema[f.name].dataType.simpleString()} -> "
        f"{f.dataType.simpleString()})"
        for f in data.schema.fields
        if f.name in current.schema.fieldNames() and current.schema[f.name].dataType != f.dataType
    ]
    removed = [c for c in current.columns if c not in data.columns]
    if changed_types or removed:
        what = [f"columns changed type: {', '.join(changed_types)}"] if changed_types else []
        what += [f"columns removed: {', '.join(removed)}"] if removed else []
        raise ConfigError(
            f"{where}: {'; '.join(what)}; a stream joining "
            f"{table} would stop on it. Keep the types, or load the new shape as a new "
            "dimension (another name) and point the pipeline's enrich at it"
        )
    version = newest_version(spark, target)
    same_columns = sorted(current.columns) == sorted(data.columns)
    if same_columns and not differ(current.select(*data.columns), data):
        log.info("%s: unchanged (version %d)", dimension.name, version)
        return Refreshed(version, count, False)
    held.check()
    writer = data.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
    fenced(writer, dimension, held).save(table.spark_uri)
    after = newest_version(spark, target)
    if after == version:
        # Delta skipped the write: a newer loader's commit carries a higher token.
        raise LeaseLostError(
            f"{where}: a newer load of {table} committed while this one was paused (its "
            f"lease generation {held.generation} is past): this one wrote nothing"
        )
    return Refreshed(after, count, True)


def fenced(writer: DataFrameWriter, dimension: Dimension, held: Holding) -> DataFrameWriter:
    """The load's commit carries the hold's fencing token (a lease's generation) as
    a Delta transaction: Delta skips a write whose token is at or below the one the
    table recorded, in the snapshot the commit is made on (a newer loader's commit
    between the two fails this one: a concurrent transaction), so a loader woken
    after a takeover writes nothing. A flock (a local warehouse) needs none."""
    if held.generation is None:
        return writer
    return writer.option("txnAppId", txn_app_id(dimension)).option(
        "txnVersion", str(held.generation)
    )


def txn_app_id(dimension: Dimension) -> str:
    return f"dimension:{dimension.name}"


def recorded_generation(dimension: Dimension, table: Location) -> int | None:
    """The lease generation the table's last load carried (its Delta transaction),
    or None (no table yet, or loaded on a local disk, which carries none)."""
    if not RsDeltaTable.is_deltatable(str(table)):
        return None
    version = RsDeltaTable(str(table)).transaction_version(txn_app_id(dimension))
    return None if version is None else int(version)


def fence_ahead_of_table(held: Holding, dimension: Dimension, table: Location) -> None:
    """Put the hold's token past the one the table recorded, before the load.

    A lease object deleted by hand (or lost) begins again at generation 1, below
    what the table recorded: Delta would skip every later load, each reported as a
    newer one. The holder advances its lease past the table's token, ``If-Match``
    on the version it holds (``Lease.advance_past``): a stale holder, whose lease
    another took over (and loaded with), is refused, and writes nothing."""
    if held.generation is None:
        return  # a flock: no token, nothing recorded to be past
    recorded = recorded_generation(dimension, table)
    if recorded is None or held.generation > recorded:
        return
    try:
        held.advance_past(recorded)
    except LeaseLostError as exc:
        raise LeaseLostError(
            f"dimension {dimension.name}: a newer load of {table} committed (lease "
            f"generation {recorded}) and {exc}"
        ) from None


def newest_version(spark: SparkSession, target: str) -> int:
    found = spark.sql(f"DESCRIBE HISTORY {target} LIMIT 1").first()
    assert found is not None
    return int(found["version"])


def differ(before: DataFrame, after: DataFrame) -> bool:
    """Whether two frames of one schema hold other rows (as multisets)."""
    return bool(
        before.exceptAll(after).limit(1).count() or after.exceptAll(before).limit(1).count()
    )
