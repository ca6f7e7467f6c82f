"""A record's way through a pipeline, in Spark: parsed, derived, filtered, judged.

Every Kafka record ends as exactly one of:

* **aggregated**: its keys, event time and what it adds to each aggregate
  (``contributions``);
* **filtered**: the pipeline's ``filter`` is false for it;
* **dead-lettered**, with a reason: it does not parse into the schema, an
  expression fails on it (a cast, an overflow, a division by zero) or yields
  null, its event time is out of bounds, or its window has closed.

Every step is total: a record's content can only make it a dead letter, never
fail the batch. Expressions run under ANSI SQL (an overflow is an error, never a
wrapped number) inside Catalyst's ``TryEval``, which turns the error of that
record into null; wrapping the value in a struct tells a failure (no struct) from
a null value. ``analyser.resolve`` checks the expressions with Spark's analyser before
anything runs and learns the derived columns' types.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs import sql_text
from jobs.pipeline.checks import event_time_unit
from jobs.pipeline.model import KAFKA_COLUMNS, Pipeline, TimeUnit
from jobs.resolution import Resolved
from jobs.state_seed import RECORDS, contribution, sketch_input
from jobs.streaming import batch_clock, enrichment

log = logging.getLogger(__name__)
# The event-time watermark and the batch time a record is judged by: the stream
# batch's (``batch_clock.py``), or in a backfill the ones the ledger recorded for the
# stream batch that judged the record.
WATERMARK_COLUMN = batch_clock.WATERMARK_COLUMN
BATCH_TIME_COLUMN = batch_clock.TIME_COLUMN
CORRUPT = "_corrupt_record"
# Oldest event time accepted whatever the pipeline says: windows near year 1 are
# not representable by Python's datetime (readers of the tables would fail).
MIN_EVENT_US = -30610224000 * 1_000_000  # 1000-01-01T00:00:00Z
# Whole numbers summed (sum, avg) are bounded so that one record cannot overflow a
# 64-bit sum: it takes 1024 records at the bound on one key to reach 2**63. A
# decimal sum (38 digits) is bounded alike: 10**10 records at the bound.
MAX_SUMMAND = 2**53
DECIMAL_HEADROOM = 10
UNIT_MICROS = {"seconds": 1_000_000, "milliseconds": 1_000, "microseconds": 1}
HEADERS_TYPE = KAFKA_COLUMNS["kafka.headers"]


def _schema_ddl(pipeline: Pipeline, as_strings: bool) -> str:
    fields = [
        f"`{name}` {'string' if as_strings else kind}" for name, kind in pipeline.schema.items()
    ]
    return ", ".join([*fields, f"`{CORRUPT}` string"])


def _iso(micros: int) -> str:
    moment = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=micros)
    return moment.isoformat().replace("+00:00", "Z")


def _tried(spark: SparkSession, sql: str) -> Column:
    """``sql`` evaluated per record, as a struct ``{v: value}``, or null when the
    evaluation fails on that record (Catalyst's ``TryEval``).

    The IF keeps the expression out of Spark's subexpression elimination, which
    would otherwise compute a part two expressions share (``CAST(x AS INT)``)
    once, before and outside both TryEvals, where its error fails the batch: it
    never looks inside a branch. ``_offset >= 0`` always holds and cannot be
    folded away. The newline ends a trailing "--" comment of ``sql``.
    """
    jvm = spark._jvm
    assert jvm is not None
    parser = spark._jsparkSession.sessionState().sqlParser()
    wrapped = parser.parseExpression(f"IF(_offset >= 0, named_struct('v', ({sql}\n)), NULL)")
    expressions = jvm.org.apache.spark.sql.catalyst.expressions
    column = jvm.org.apache.spark.sql.classic.ExpressionUtils.column(expressions.TryEval(wrapped))
    return Column(column)


def user_columns(raw: DataFrame, pipeline: Pipeline) -> DataFrame:
    """The record as its expressions see it: the schema's fields, and ``kafka`` (the
    record's key, timestamp, topic, partition, offset and headers). The platform's
    own columns start with "_"."""
    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}
    text = F.col("value").cast("string")
    headers = F.col("headers") if "headers" in raw.columns else F.lit(None).cast(HEADERS_TYPE)
    kafka = F.struct(
        F.col("key").cast("string").alias("key"),
        F.col("timestamp").alias("timestamp"),
        F.col("topic").alias("topic"),
        F.col("partition").alias("partition"),
        F.col("offset").alias("offset"),
        headers.alias("headers"),
    )
    extra = [c for c in (WATERMARK_COLUMN, BATCH_TIME_COLUMN) if c in raw.columns]
    extra += [c for c in raw.columns if c.startswith(enrichment.PREFIX)]
    base = raw.select(
        F.col("topic").alias("_topic"),
        F.col("partition").alias("_partition"),
        F.col("offset").alias("_offset"),
        F.col("timestamp").alias("_timestamp"),
        F.col("key").alias("_key"),
        F.col("value").alias("_value"),
        *extra,
        F.from_json(text, _schema_ddl(pipeline, False), options).alias("_t"),
        kafka.alias("kafka"),
    )
    return base.select("*", *(F.col(f"_t.`{n}`").alias(n) for n in pipeline.schema))


def _structure_checks(pipeline: Pipeline) -> list[tuple[Column, Column]]:
    """Why a record does not parse into the schema (only such records pay for the
    second, all-strings parse that explains it)."""
    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}
    text = F.col("_value").cast("string")
    loose = F.from_json(text, _schema_ddl(pipeline, True), options)
    checks: list[tuple[Column, Column]] = [
        (F.col("_value").isNull(), F.lit("value is null")),
        (~F.is_valid_utf8(text), F.lit("value is not valid UTF-8")),
        (F.col("_t").isNull(), F.lit("value is empty")),
        (loose.getField(CORRUPT).isNotNull(), F.lit("not a JSON object")),
    ]
    checks += [
        (loose.getField(name).isNull(), F.lit(f"missing or null field {name!r}"))
        for name in pipeline.schema
    ]
    for name, kind in pipeline.schema.items():
        reason = F.concat(
            F.lit(f"field {name!r} is not a {kind}: "), F.substring(loose.getField(name), 1, 100)
        )
        checks.append((F.col(f"_t.`{name}`").isNull(), reason))
    return checks


def _expression_checks(pipeline: Pipeline) -> list[tuple[Column, Column]]:
    """Values the record's fields hold that cannot be aggregated, and expressions
    that fail (or yield nothing) on it, in the order they are evaluated."""
    checks: list[tuple[Column, Column]] = []
    for name, kind in pipeline.schema.items():
        if kind in sql_text.FRACTIONAL:
            value = F.col(f"`{name}`")
            infinite = F.isnan(value) | (F.abs(value) == float("inf"))
            checks.append((infinite, F.lit(f"field {name!r} is NaN or infinite")))
    for i, derived in enumerate(pipeline.derived):
        shown = derived.expr if len(derived.expr) <= 120 else derived.expr[:117] + "..."
        checks.append(
            (
                F.col(f"_d{i}").isNull(),
                F.lit(
                    f"derived {derived.name!r} failed: {shown} (an error on this record: a "
                    "cast, an overflow, a division by zero, ...)"
                ),
            )
        )
        checks.append(
            (
                F.col(f"`{derived.name}`").isNull(),
                F.lit(f"derived {derived.name!r} is null: {shown} (coalesce() gives a default)"),
            )
        )
    if pipeline.filter is not None:
        checks.append((F.col("_f").isNull(), F.lit(f"filter failed: {pipeline.filter}")))
        checks.append((F.col("_f.v").isNull(), F.lit(f"filter is null: {pipeline.filter}")))
    return checks


def _summand_checks(resolved: Resolved) -> list[tuple[Column, Column]]:
    """Values summed (sum, avg) that could overflow the state's sum, or are not numbers."""
    pipeline = resolved.pipeline
    checks: list[tuple[Column, Column]] = []
    seen: set[str] = set()
    for agg in pipeline.aggregations:
        if agg.function not in ("sum", "avg", "min", "max") or agg.field in seen:
            continue
        assert agg.field is not None
        seen.add(agg.field)
        kind = resolved.column_type(agg.field) or ""
        value = _value(agg.field)
        what = f"{agg.field!r} = "
        if kind in sql_text.FRACTIONAL and agg.field not in pipeline.schema:
            infinite = F.isnan(value) | (F.abs(value) == float("inf"))
            checks.append((infinite, F.lit(f"{agg.field!r} is NaN or infinite")))
        if agg.function not in ("sum", "avg"):
            continue
        scale = sql_text.decimal_scale(kind)
        if kind in sql_text.INTEGRAL:
            bound, text = MAX_SUMMAND, "+-2^53, where a sum of such values overflows 64 bits"
        elif scale is not None:
            digits = 38 - scale[1] - DECIMAL_HEADROOM
            bound, text = 10**digits, f"+-10^{digits}, where a sum overflows 38 digits"
        else:
            continue
        checks.append(
            (
                F.abs(value.cast("decimal(38,0)")) > F.lit(str(bound)).cast("decimal(38,0)"),
                F.concat(F.lit(f"field {what}"), value.cast("string"), F.lit(f" is beyond {text}")),
            )
        )
    return checks


def _value(name: str) -> Column:
    """A field, derived column or ``kafka.*`` column of the record."""
    if name in KAFKA_COLUMNS:
        return F.col(name)
    return F.col(f"`{name}`")


def _event_micros(spark: SparkSession, resolved: Resolved) -> Column:
    """Event time in microseconds, or null when it does not fit in 64 bits."""
    column, unit = resolved.pipeline.event_time.column, _event_unit(resolved)
    kind = resolved.column_type(column)
    value = _value(column)
    if kind in ("timestamp", "timestamp_ntz", "date"):
        return F.unix_micros(value.cast("timestamp"))
    assert unit is not None
    sql = f"CAST({_sql_name(column)} * {UNIT_MICROS[unit]} AS BIGINT)"
    return _tried(spark, sql).getField("v")


def _event_unit(resolved: Resolved) -> TimeUnit | None:
    """The unit event time is read in (a derived number's default is known only
    once Spark has told its type; the definition keeps what the file says)."""
    event = resolved.pipeline.event_time
    return event_time_unit(resolved.column_type(event.column) or "", event.unit, event.column)


def _sql_name(name: str) -> str:
    return name if name in KAFKA_COLUMNS else f"`{name}`"


def _first_reason(checks: list[tuple[Column, Column]], otherwise: Column) -> Column:
    """The reason of the first check that holds; a null condition (a comparison with
    a null field) means "not this problem"."""
    reason = otherwise
    for condition, text in reversed(checks):
        reason = F.when(F.coalesce(condition, F.lit(False)), text).otherwise(reason)
    return reason


def _time_checks(
    resolved: Resolved, late_check: bool, batch_time: bool
) -> list[tuple[Column, Column]]:
    pipeline = resolved.pipeline
    column, unit = pipeline.event_time.column, _event_unit(resolved)
    given = F.concat(
        F.lit(f"event time {column!r} = "),
        _value(column).cast("string"),
        F.lit(f" {unit}" if unit else ""),
    )
    event_us = F.col("_event_us")
    lower = max(MIN_EVENT_US, pipeline.not_before_us or MIN_EVENT_US)
    # The stream's batch time is from Spark's offset log (a column, batch_clock.py):
    # the same on a replay. A backfill passes each record's batch time from the
    # ledger, so it bounds event time as the stream did. Without either (a batch
    # query), now.
    now = F.timestamp_millis(F.col(BATCH_TIME_COLUMN)) if batch_time else F.current_timestamp()
    upper = F.unix_micros(now) + F.lit(pipeline.max_ahead_seconds * 1_000_000)
    checks = [
        (event_us.isNull(), F.concat(given, F.lit(" is out of range"))),
        (
            event_us < F.lit(lower),
            F.concat(given, F.lit(f" is before {_iso(lower)} (event_time.not_before)")),
        ),
        (
            event_us > upper,
            F.concat(
                given,
                F.lit(f" is more than {pipeline.max_ahead_seconds} s ahead of the batch time "),
                now.cast("string"),
                F.lit(" (event_time.max_ahead)"),
            ),
        ),
    ]
    if late_check:
        assert pipeline.window is not None
        slide = pipeline.window.slide_seconds * 1_000_000
        # The earliest window a record falls in ends first: if it is open, all are.
        first_end = event_us - F.pmod(event_us, F.lit(slide)) + F.lit(slide)
        watermark_us = F.col(WATERMARK_COLUMN) * 1000
        checks.append(
            (
                first_end <= watermark_us,
                F.concat(
                    F.lit("late: window ending "),
                    F.timestamp_micros(first_end).cast("string"),
                    F.lit(" closed at watermark "),
                    F.timestamp_micros(watermark_us).cast("string"),
                ),
            )
        )
    return checks


def classify(raw: DataFrame, resolved: Resolved) -> DataFrame:
    """Raw Kafka rows -> the record's columns, ``_event_us``, ``_filtered`` and
    ``_reason`` (null unless a dead letter). ``resolved`` comes from ``analyser.resolve``.

    With a ``_batch_watermark_ms`` column (the stream), a record whose window the
    watermark has closed is a dead letter too (``late:``) instead of a silent drop
    inside the aggregation. ``_batch_time_ms`` is the time event times are bounded by
    (``event_time.max_ahead``).
    """
    spark = raw.sparkSession
    pipeline = resolved.pipeline
    frame = enrichment.enriched(user_columns(raw, pipeline), pipeline)
    for i, derived in enumerate(pipeline.derived):
        frame = frame.withColumn(f"_d{i}", _tried(spark, derived.expr))
        frame = frame.withColumn(derived.name, F.col(f"_d{i}.v"))
    if pipeline.filter is not None:
        frame = frame.withColumn("_f", _tried(spark, pipeline.filter))
    frame = frame.withColumn("_event_us", _event_micros(spark, resolved))
    late_check = pipeline.window is not None and WATERMARK_COLUMN in raw.columns
    batch_time = BATCH_TIME_COLUMN in raw.columns

    parses = F.is_valid_utf8(F.col("_value").cast("string"))
    parses = parses & F.col("_t").isNotNull() & F.col(f"_t.{CORRUPT}").isNull()
    for name in pipeline.schema:
        parses = parses & F.col(f"_t.`{name}`").isNotNull()
    unparsed = _first_reason(_structure_checks(pipeline), F.lit("invalid record"))
    judged = _first_reason(
        _summand_checks(resolved) + _time_checks(resolved, late_check, batch_time),
        F.lit(None).cast("string"),
    )
    kept = F.lit(True) if pipeline.filter is None else F.col("_f.v")
    reason = F.when(
        F.col("_value").isNotNull() & parses,
        _first_reason(
            enrichment.checks(resolved) + _expression_checks(pipeline),
            F.when(kept, judged).otherwise(F.lit(None).cast("string")),
        ),
    ).otherwise(unparsed)
    frame = frame.withColumn("_reason", reason)
    return frame.withColumn("_filtered", F.col("_reason").isNull() & ~F.coalesce(kept, F.lit(True)))


def _window_times(pipeline: Pipeline) -> Column:
    """A record's ``_event_time``: its event time, or with a hopping window one row
    per window it falls in, at that window's last pane (the event time plus k
    slides): ``query.aggregate`` keys a hopping window by its last pane, which no
    other window has, so a seed row (``state_seed.seed_rows``) reaches its window only."""
    event_us = F.col("_event_us")
    window = pipeline.window
    if window is None or window.windows_per_record == 1:
        return F.timestamp_micros(event_us)
    slide_us = window.slide_seconds * 1_000_000
    return F.explode(
        F.array(
            *(
                F.timestamp_micros(event_us + F.lit(k * slide_us))
                for k in range(window.windows_per_record)
            )
        )
    )


def contributions(classified: DataFrame, resolved: Resolved) -> DataFrame:
    """Aggregated records -> keys, event time and what each adds to each aggregate
    (with a hopping window: a row per window, see ``_window_times``)."""
    pipeline = resolved.pipeline
    valid = classified.filter(F.col("_reason").isNull() & ~F.col("_filtered"))
    types = resolved.contributions
    columns = [F.col(f"`{k}`").alias(k) for k in pipeline.keys]
    columns.append(_window_times(pipeline).alias("_event_time"))
    for agg in pipeline.aggregations:
        name = contribution(agg)
        value = F.lit(1) if agg.field is None else _value(agg.field)
        if agg.function == "approx_count_distinct":
            # The value goes into the sketch as text (binary as hex): one hash per
            # value, whatever its type; a record brings no sketch of its own.
            kind = resolved.column_type(str(agg.field))
            text = F.hex(value) if kind == "binary" else value.cast("string")
            columns.append(text.alias(sketch_input(agg)))
            value = F.lit(None)
        columns.append(value.cast(types[name]).alias(name))
    columns.append(F.lit(1).cast("bigint").alias(RECORDS))
    return valid.select(*columns)


OBSERVATION = "batch_input"


def observe_input(classified: DataFrame) -> DataFrame:
    """Per-batch input accounting, collected alongside the batch's single scan.

    Dead letters travel to the driver as positions and reasons only (a few hundred
    bytes each); their keys and values are fetched from Kafka by position when they
    are written (``dead_letters.py``), so large bad records never pass through
    Spark's metrics or the driver's memory at once.
    """
    dead = F.col("_reason").isNotNull()
    filtered = F.col("_filtered")
    # The version and table id of each dimension table the batch joined (one per batch).
    versions = [
        F.max(c).alias(c)
        for c in classified.columns
        if c.startswith(enrichment.PREFIX) and c.endswith(("_version", "_table"))
    ]
    return classified.observe(
        OBSERVATION,
        *versions,
        F.count(F.lit(1)).alias("records_in"),
        F.count_if(~dead & ~filtered).alias("records_valid"),
        F.count_if(filtered).alias("filtered"),
        F.count_if(dead).alias("dead_lettered"),
        # For the event-to-commit latency metric (null on a batch without records).
        F.min(F.unix_micros("_timestamp")).alias("oldest_record_us"),
        F.collect_list(
            F.when(
                dead,
                F.struct(
                    F.col("_topic").alias("topic"),
                    F.col("_partition").alias("partition"),
                    F.col("_offset").alias("offset"),
                    F.unix_micros("_timestamp").alias("kafka_timestamp"),
                    F.substring(F.col("_reason"), 1, 300).alias("reason"),
                ),
            )
        ).alias("dead_letters"),
    )
