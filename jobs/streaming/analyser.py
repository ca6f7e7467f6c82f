"""A pipeline checked by Spark's analyser before anything runs: ``resolve``.

Every expression is analysed over an empty frame of the record's columns: it must
call only Spark's built-in functions, stay per record and be deterministic (no
clock or session value: a replay must compute the same answer). What the analyser
answers (each derived column's type, each enrichment table's schema, whether the
Kafka headers are read) becomes the pipeline's ``Resolved`` (``jobs/resolution.py``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs import resolution, spark_functions, sql_text
from jobs.delta import layout as tables
from jobs.errors import ConfigError
from jobs.kafka_source import spark_kafka
from jobs.pipeline.checks import TypeProblem, aggregate_type, event_time_unit
from jobs.pipeline.model import Pipeline
from jobs.resolution import DimensionTable, Resolved
from jobs.streaming import enrichment
from jobs.streaming.judging import HEADERS_TYPE, user_columns
from jobs.streaming.spark import check_sql_settings
from jobs.warehouse import Location

log = logging.getLogger(__name__)
# The plan steps of expressions computed per record, from the record alone (an
# aggregate, a window or generator function, a subquery bring in others).
PLAN_STEPS_PER_RECORD = {"Project", "LogicalRDD", "LocalRelation"}


def _dimension_tables(
    spark: SparkSession, pipeline: Pipeline, record: DataFrame, warehouse: Location | None
) -> dict[str, DimensionTable]:
    """Each enrichment's table as Spark reads it now: a Delta table with the key
    column, of the record key's type."""
    origin = str(pipeline.source_path or pipeline.application_id)
    found: dict[str, DimensionTable] = {}
    for i, e in enumerate(pipeline.enrich):
        if warehouse is None and e.table.startswith("${"):
            raise ConfigError(f"{origin}: enrich[{i}].table: needs the warehouse to resolve")
        path = e.path(warehouse) if warehouse is not None else e.table
        tables.check_table_path(path, f"{origin}: enrich[{i}].table:")
        try:
            schema = spark.read.format("delta").load(path).schema
        except PySparkException as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(
                f"{origin}: enrich[{i}].table: {path} cannot be read as a Delta table ({first})"
            ) from None
        columns = {f.name: f.dataType.simpleString() for f in schema.fields}
        if e.table_key not in columns:
            raise ConfigError(
                f"{origin}: enrich[{i}].on: {path} has no column {e.table_key!r} (it has "
                f"{', '.join(columns)})"
            )
        key_type = columns[e.table_key]
        if not sql_text.is_atomic(key_type):
            raise ConfigError(
                f"{origin}: enrich[{i}].on: {e.name}.{e.table_key} is a {key_type}: a key must "
                "be a single value"
            )
        try:
            record_type = record.select(F.expr(e.record_key)).schema[0].dataType.simpleString()
        except PySparkException as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(f"{origin}: enrich[{i}].on: {first}") from None
        if record_type != key_type:
            raise ConfigError(
                f"{origin}: enrich[{i}].on: {e.record_key} is a {record_type} and "
                f"{e.name}.{e.table_key} a {key_type}: they must have one type"
            )
        found[e.name] = DimensionTable(path, schema.json(), key_type)
    return found


# Expressions whose value is the clock, the session or the environment: Spark's
# own ``deterministic`` flag is true for them (one value per query), but a replay
# or a backfill runs another query. Spark resolves some from bare names (``user``,
# a backquoted ``current_date``), whatever the text looked like.
CLOCK_OR_SESSION = {
    "CurrentDate",
    "CurrentTimestamp",
    "CurrentTime",
    "Now",
    "LocalTimestamp",
    "CurrentTimeZone",
    "CurrentUser",
    "CurrentDatabase",
    "CurrentCatalog",
    "CurrentBatchTimestamp",
    "SparkVersion",
}
TIME_TYPES = {"date", "timestamp", "timestamp_ntz"}
RUNTIME_REPLACEABLE = "org.apache.spark.sql.catalyst.expressions.RuntimeReplaceable"
TYPED_LITERAL = re.compile(r"^\s*(date|timestamp(_ntz|_ltz)?)\s*", re.IGNORECASE)


@dataclass
class _Findings:
    refusal: str | None = None
    reads_headers: bool = False


def _tree_findings(spark: SparkSession, expression: Any) -> _Findings:
    """What Spark's analysed expression reads: the clock or the session, a date or
    time folded from a string (``DATE 'today'``, ``CAST('no' 'w' AS TIMESTAMP)``,
    escapes and all: Spark has undone them), and whether it reads ``kafka.headers``."""
    found = _Findings()
    jvm = spark._jvm
    assert jvm is not None
    replaceable = jvm.java.lang.Class.forName(RUNTIME_REPLACEABLE)
    # A replacement shares its arguments with the written node (and is the node's
    # child for some): each node once, or nesting would double the walk per level.
    seen = jvm.java.util.IdentityHashMap()
    pending = [expression]
    while pending and found.refusal is None:
        node = pending.pop()
        if seen.put(node, True) is not None:
            continue
        kind = node.getClass().getSimpleName()
        children = [node.children().apply(i) for i in range(node.children().size())]
        if replaceable.isInstance(node):
            # What Spark runs instead (``to_date(s)`` is ``CAST(s AS DATE)``): the
            # optimiser swaps it in, so judge it as well as the written arguments.
            children.append(node.replacement())
        if kind in CLOCK_OR_SESSION or kind.startswith("Current"):
            found.refusal = (
                f"reads the clock or the session ({node.prettyName()}): a replay or a "
                "backfill would compute another result"
            )
        elif kind == "Cast" and node.dataType().typeName() in TIME_TYPES:
            child = node.child()
            if child.foldable() and child.dataType().typeName() == "string":
                found.refusal = _folded_time(str(child.eval(None)), node.dataType().typeName())
        elif kind == "Literal" and node.dataType().typeName() in TIME_TYPES:
            text = _typed_literal_text(spark, node)
            if text is not None:
                found.refusal = _folded_time(text, node.dataType().typeName())
        elif kind == "GetStructField" and _is_kafka(children[0]):
            found.reads_headers |= node.extractFieldName().lower() == "headers"
            children = []  # one field of kafka, not the whole struct
        elif _is_kafka(node):
            found.reads_headers = True  # the whole struct, headers included
        pending.extend(children)
    return found


def _is_kafka(node: Any) -> bool:
    return bool(node.getClass().getSimpleName() == "AttributeReference" and node.name() == "kafka")


def _folded_time(text: str, kind: str) -> str | None:
    """Spark reads "now", "today", "yesterday", "tomorrow" and "epoch" (any case,
    spaced) as special values in a typed literal or a cast of a constant string:
    the first two are the current time. A written date or time starts with a digit
    or a sign."""
    value = text.strip()
    if not value or value[0].isdigit() or value[0] in "+-":
        return None
    example = "DATE '2026-01-31'" if kind == "date" else "TIMESTAMP '2026-01-31 10:00:00'"
    return (
        f"reads the string {value!r} as a {kind}: Spark takes words there for the current "
        f"date or time; write the value itself (e.g. {example})"
    )


def _typed_literal_text(spark: SparkSession, literal: Any) -> str | None:
    """The string a typed literal (``DATE '...'``) was written with, as Spark's
    parser reads it (escapes undone), from the literal's place in the expression's
    text; None for a literal that was not written as one."""
    origin = literal.origin()
    if origin.sqlText().isEmpty() or origin.startIndex().isEmpty():
        return None
    text = str(origin.sqlText().get())
    piece = text[int(origin.startIndex().get()) : int(origin.stopIndex().get()) + 1]
    match = TYPED_LITERAL.match(piece)
    if match is None:
        return None
    parser = spark._jsparkSession.sessionState().sqlParser()
    written = parser.parseExpression(piece[match.end() :])
    if written.getClass().getSimpleName() != "Literal":
        return None
    return str(written.value())


@cache
def _builtin_functions(spark: SparkSession) -> frozenset[str]:
    return frozenset(r[0].lower() for r in spark.sql("SHOW SYSTEM FUNCTIONS").collect())


def resolve(spark: SparkSession, pipeline: Pipeline, warehouse: Location | None = None) -> Resolved:
    """The pipeline checked by Spark's analyser, with every column's type.

    Each expression must resolve over the record's fields, ``kafka`` and the derived
    columns before it, call only Spark's built-in functions, stay per record (no
    aggregate, window or generator) and be deterministic; the filter is a boolean;
    keys, event time and aggregated columns have usable types. One ``ConfigError``
    names the file, the field and the reason.
    """
    origin = str(pipeline.source_path or pipeline.application_id)
    pinned = check_sql_settings(spark)
    kafka_schema = f"{spark_kafka.COLUMNS}, headers {HEADERS_TYPE}"
    frame = user_columns(spark.createDataFrame([], kafka_schema), pipeline)
    frame = frame.select(*(f"`{n}`" for n in pipeline.schema), "kafka")
    tables = _dimension_tables(spark, pipeline, frame, warehouse)
    frame = frame.select(
        "*",
        *(F.lit(None).cast(enrichment.row_type(t)).alias(name) for name, t in tables.items()),
    )
    # Spark's registry is listed only for a call this Spark's review does not know.
    known = spark_functions.IN_REGISTRY if spark.version == spark_functions.REVIEWED_SPARK else None
    types: dict[str, str] = {}
    headers = False
    for where, sql in pipeline.expressions:
        name = where.split(" (")[1][:-1] if where.startswith("derived") else "_filter"
        _check_calls(f"{origin}: {where}", sql, known, lambda: _builtin_functions(spark))
        frame, kind, found = _analysed(frame, spark, sql, name, f"{origin}: {where}")
        headers = headers or found.reads_headers
        if name == "_filter":
            if kind != "boolean":
                raise ConfigError(f"{origin}: filter: must be a boolean, is a {kind}: {sql!r}")
            frame = frame.drop("_filter")
        else:
            types[name] = kind
    _check_types(origin, pipeline, types)
    resolved = resolution.of(pipeline, types, tables, headers, pinned)
    if pipeline.archive and resolved.uses_headers:
        raise ConfigError(
            f"{origin}: source.archive: the raw archive does not keep Kafka headers: a "
            "backfill from it could not recompute what reads kafka.headers"
        )
    return resolved


def _check_calls(
    where: str,
    sql: str,
    known: frozenset[str] | None,
    builtin: Callable[[], frozenset[str]],
) -> None:
    """``sql`` calls only Spark's built-in functions that the platform reviewed for
    replays (from its text). ``known``: functions this Spark's registry is known to
    hold; ``builtin`` lists the registry, asked only for a call outside ``known``."""
    try:
        calls = sql_text.check_expression(sql)
        unknown = sorted(set(calls) - (known or frozenset()))
        if unknown:
            unknown = sorted(set(unknown) - builtin())
    except sql_text.SqlTextError as exc:
        raise ConfigError(f"{where}: {exc} (in {sql!r})") from None
    if unknown:
        raise ConfigError(
            f"{where}: calls {', '.join(unknown)}, not a Spark built-in function "
            "(user-defined functions are not allowed)"
        )
    unreviewed = sorted(set(calls) - spark_functions.CLASSIFIED)
    if unreviewed:
        raise ConfigError(
            f"{where}: calls {', '.join(unreviewed)}, a function this Spark has "
            "and the platform has not reviewed for replays (classify it in "
            "jobs/spark_functions.py)"
        )


def _analysed(
    frame: DataFrame, spark: SparkSession, sql: str, name: str, where: str
) -> tuple[DataFrame, str, _Findings]:
    """``frame`` with ``sql`` as column ``name``, its type and what its tree reads,
    by Spark's analyser: one value per record from the record alone, deterministic,
    nothing the platform refuses."""
    try:
        frame = frame.select("*", F.expr(sql).alias(name))
        kind = frame.schema[name].dataType.simpleString()
        node = frame._jdf.queryExecution().analyzed()
        lines = node.treeString().splitlines()
        steps = {line.lstrip(" :+-").split(" ")[0] for line in lines}
        # A subquery's plan is printed under its expression, marked ":".
        subquery = any(line.lstrip().startswith(":") for line in lines)
        per_record = steps <= PLAN_STEPS_PER_RECORD and not subquery
        expression = node.projectList().last()
        deterministic = per_record and expression.deterministic()
        found = _tree_findings(spark, expression) if per_record else _Findings()
    except PySparkException as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"{where}: {first} (in {sql!r})") from None
    if not per_record:
        raise ConfigError(
            f"{where}: must compute one value per record from the record alone "
            f"(no aggregate, window or generator function, no subquery), in {sql!r}"
        )
    if not deterministic:
        raise ConfigError(
            f"{where}: is not deterministic: a replay would compute another result, in {sql!r}"
        )
    if found.refusal:
        raise ConfigError(f"{where}: {found.refusal}, in {sql!r}")
    return frame, kind, found


def _check_types(origin: str, pipeline: Pipeline, types: dict[str, str]) -> None:
    """Keys, the event time and the aggregated columns have usable types, now that
    Spark has typed the derived columns (``types``)."""

    def kind_of(name: str) -> str:
        return types.get(name) or pipeline.column_type(name) or ""

    for key in pipeline.keys:
        if not sql_text.is_atomic(kind_of(key)):
            raise ConfigError(
                f"{origin}: keys: {key!r} is a {kind_of(key)}: a key must be a single value"
            )
    event = pipeline.event_time
    try:
        event_time_unit(kind_of(event.column), event.unit, repr(event.column))
    except TypeProblem as exc:
        raise ConfigError(f"{origin}: event_time.{exc.key}: {exc}") from None
    for i, agg in enumerate(pipeline.aggregations):
        try:
            aggregate_type(agg, kind_of(agg.field) if agg.field else "")
        except TypeProblem as exc:
            raise ConfigError(f"{origin}: aggregations[{i}].{exc.key}: {exc}") from None
