"""The streaming query of a pipeline: Kafka -> parse -> stateful aggregation.

Parsing happens in Spark (``from_json``). Every record is either valid, and goes
to the aggregation, or gets a reason and becomes a dead letter. The input side
is observed per batch (counts and the dead letters themselves, see
``observed.py``) so that the source is read once: a union of a dead-letter
branch with the aggregation would scan Kafka twice.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.kafka_source import spark_kafka
from jobs.pipeline import Pipeline
from jobs.snapshot import SPARK_TYPES, contribution_types
from jobs.streaming import batch_watermark
from jobs.streaming.seed import hold_stream

OBSERVATION = "batch_input"
# The event-time watermark a record is judged by: the stream's batch watermark
# (``batch_watermark.py``), or in a backfill the one the ledger recorded.
WATERMARK_COLUMN = batch_watermark.COLUMN
# A backfill's records carry the time of the stream batch that judged them.
BATCH_TIME_COLUMN = "_batch_time_ms"
CORRUPT = "_corrupt_record"


def read_kafka(
    spark: SparkSession,
    pipeline: Pipeline,
    bootstrap_servers: str,
    starting_offsets_json: str,
    client_settings: dict[str, str],
) -> DataFrame:
    """The pipeline's topics with Spark's own Kafka source, from the epoch's cut
    (``startingOffsets`` names every partition; later partitions start at their
    earliest offset)."""
    reader = spark.readStream.format(spark_kafka.FORMAT)
    for key, value in spark_kafka.source_options(bootstrap_servers, client_settings).items():
        reader = reader.option(key, value)
    reader = reader.option("subscribe", ",".join(pipeline.topics)).option(
        "startingOffsets", starting_offsets_json
    )
    if pipeline.max_offsets_per_trigger is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(pipeline.max_offsets_per_trigger))
    return reader.load()


def _schema_ddl(pipeline: Pipeline, as_strings: bool) -> str:
    fields = [
        f"`{name}` {'string' if as_strings else SPARK_TYPES[kind]}"
        for name, kind in pipeline.schema.items()
    ]
    return ", ".join([*fields, f"`{CORRUPT}` string"])


# Oldest event time accepted whatever the pipeline says: windows near year 1 are
# not representable by Python's datetime (readers of the tables would fail).
MIN_EVENT_US = -30610224000 * 1_000_000  # 1000-01-01T00:00:00Z
# Long values summed (sum, avg) are bounded so that one record cannot overflow a
# 64-bit sum: it takes 1024 records at the bound on one key to reach 2**63.
MAX_SUMMAND = 2**53
UNIT_MICROS = {"seconds": 1_000_000, "milliseconds": 1_000, "microseconds": 1}


def _event_micros(pipeline: Pipeline) -> Column:
    """Event time in microseconds, or null when it does not fit in 64 bits (total:
    never an ANSI overflow, whatever the record holds)."""
    value = F.col(f"t.`{pipeline.event_time_field}`")
    factor = UNIT_MICROS[pipeline.event_time_unit]
    if pipeline.schema[pipeline.event_time_field] == "double":
        scaled = value * float(factor)
        return F.when(F.abs(scaled) < 9.2e18, scaled.cast("bigint"))
    return F.try_multiply(value.cast("bigint"), F.lit(factor).cast("bigint"))


def _signed(pipeline: Pipeline, name: str) -> Column:
    """A derived field's value: the field times the sign of its category (total)."""
    derived = next(d for d in pipeline.derived if d.name == name)
    sign = F.lit(0)
    for category, factor in derived.signs.items():
        sign = F.when(F.col(f"t.`{derived.sign_by}`") == category, F.lit(factor)).otherwise(sign)
    return F.try_multiply(F.col(f"t.`{derived.field}`"), sign.cast("bigint"))


def _summed_fields(pipeline: Pipeline) -> list[str]:
    """Long/int fields that feed a sum or an average (directly or through a sign)."""
    sources = {d.name: d.field for d in pipeline.derived}
    fields: list[str] = []
    for agg in pipeline.aggregations:
        if agg.function in ("sum", "avg") and agg.field is not None:
            field = sources.get(agg.field, agg.field)
            if pipeline.schema[field] in ("long", "int") and field not in fields:
                fields.append(field)
    return fields


def _iso(micros: int) -> str:
    moment = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=micros)
    return moment.isoformat().replace("+00:00", "Z")


def _structure_checks(pipeline: Pipeline, text: Column) -> list[tuple[Column, Column]]:
    """Why a record does not parse into the schema (only such records pay for the
    second, all-strings parse that explains it)."""
    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}
    loose = F.from_json(text, _schema_ddl(pipeline, True), options)
    checks: list[tuple[Column, Column]] = [
        (F.col("value").isNull(), F.lit("value is null")),
        (~F.is_valid_utf8(text), F.lit("value is not valid UTF-8")),
        (F.col("t").isNull(), F.lit("value is empty")),
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
        checks.append((F.col(f"t.`{name}`").isNull(), reason))
    return checks


def _value_checks(pipeline: Pipeline, text: Column) -> list[tuple[Column, Column]]:
    """Problems of a record that parsed: its values, then its event time."""
    checks: list[tuple[Column, Column]] = []
    for name, kind in pipeline.schema.items():
        if kind == "double":
            value = F.col(f"t.`{name}`")
            infinite = F.isnan(value) | (F.abs(value) == float("inf"))
            checks.append((infinite, F.lit(f"field {name!r} is NaN or infinite")))
    for name in _summed_fields(pipeline):
        value = F.col(f"t.`{name}`")
        checks.append(
            (
                F.abs(value.cast("decimal(20,0)")) > MAX_SUMMAND,
                F.concat(
                    F.lit(f"field {name!r} = "),
                    value.cast("string"),
                    F.lit(" is beyond +-2^53, where a sum of such values overflows 64 bits"),
                ),
            )
        )
    for derived in pipeline.derived:
        allowed = ", ".join(sorted(derived.signs))
        category = F.col(f"t.`{derived.sign_by}`")
        checks.append(
            (
                ~category.isin(list(derived.signs)),
                F.concat(
                    F.lit(f"field {derived.sign_by!r} must be one of {allowed}, got "),
                    F.substring(category, 1, 100),
                ),
            )
        )
        checks.append(
            (_signed(pipeline, derived.name).isNull(), F.lit(f"{derived.name!r} overflows"))
        )
    return checks


def _first_reason(checks: list[tuple[Column, Column]], otherwise: Column) -> Column:
    """The reason of the first check that holds; a null condition (a comparison with
    a null field) means "not this problem"."""
    reason = otherwise
    for condition, text in reversed(checks):
        reason = F.when(F.coalesce(condition, F.lit(False)), text).otherwise(reason)
    return reason


def _time_checks(
    pipeline: Pipeline, late_check: bool, batch_time: bool
) -> list[tuple[Column, Column]]:
    field, unit = pipeline.event_time_field, pipeline.event_time_unit
    given = F.concat(
        F.lit(f"event time {field!r} = "), F.col(f"t.`{field}`").cast("string"), F.lit(f" {unit}")
    )
    event_us = F.col("_event_us")
    lower = max(MIN_EVENT_US, pipeline.not_before_us or MIN_EVENT_US)
    # In a stream, current_timestamp() is the batch's time from Spark's offset log:
    # the same on a replay. A backfill passes each record's batch time from the
    # ledger, so it bounds event time as the stream did.
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


def classify(raw: DataFrame, pipeline: Pipeline) -> DataFrame:
    """Raw Kafka rows -> typed fields, ``_event_us`` and ``_reason`` (null when valid).

    Every check is total: a record's content can only make it a dead letter with a
    reason, never fail the batch. With a ``_batch_watermark_ms`` column (the stream),
    a record whose window the watermark has closed is a dead letter too (``late:``)
    instead of a silent drop inside the aggregation.
    """
    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}
    text = F.col("value").cast("string")
    typed = F.from_json(text, _schema_ddl(pipeline, False), options)
    late_check = pipeline.window is not None and WATERMARK_COLUMN in raw.columns
    batch_time = BATCH_TIME_COLUMN in raw.columns
    extra = [WATERMARK_COLUMN] if late_check else []
    extra += [BATCH_TIME_COLUMN] if batch_time else []
    parsed = raw.select(
        "topic", "partition", "offset", "key", "value", "timestamp", *extra, typed.alias("t")
    ).withColumn("_event_us", _event_micros(pipeline))
    parses = F.is_valid_utf8(text) & F.col("t").isNotNull() & F.col(f"t.{CORRUPT}").isNull()
    for name in pipeline.schema:
        parses = parses & F.col(f"t.`{name}`").isNotNull()
    unparsed = _first_reason(_structure_checks(pipeline, text), F.lit("invalid record"))
    checks = _value_checks(pipeline, text) + _time_checks(pipeline, late_check, batch_time)
    reason = F.when(
        F.col("value").isNotNull() & parses, _first_reason(checks, F.lit(None).cast("string"))
    ).otherwise(unparsed)
    return parsed.withColumn("_reason", reason)


def observe_input(classified: DataFrame) -> DataFrame:
    """Per-batch input accounting, collected alongside the batch's single scan.

    Dead letters travel to the driver as positions and reasons only (a few hundred
    bytes each); their keys and values are fetched from Kafka by position when they
    are written (``dead_letters.py``), so large bad records never pass through
    Spark's metrics or the driver's memory at once.
    """
    dead = F.col("_reason").isNotNull()
    return classified.observe(
        OBSERVATION,
        F.count(F.lit(1)).alias("records_in"),
        F.count_if(~dead).alias("records_valid"),
        F.count_if(dead).alias("dead_lettered"),
        # For the event-to-commit latency metric (null on a batch without records).
        F.min(F.unix_micros("timestamp")).alias("oldest_record_us"),
        F.collect_list(
            F.when(
                dead,
                F.struct(
                    "topic",
                    "partition",
                    "offset",
                    F.unix_micros("timestamp").alias("kafka_timestamp"),
                    F.substring(F.col("_reason"), 1, 300).alias("reason"),
                ),
            )
        ).alias("dead_letters"),
    )


def record_contributions(classified: DataFrame, pipeline: Pipeline) -> DataFrame:
    """Valid Kafka records -> keys, event time and what each adds to each aggregate."""
    valid = classified.filter(F.col("_reason").isNull())
    derived = {d.name for d in pipeline.derived}
    types = contribution_types(pipeline)
    columns = [F.col(f"t.`{k}`").alias(k) for k in pipeline.keys]
    columns.append(F.timestamp_micros(F.col("_event_us")).alias("_event_time"))
    for agg in pipeline.aggregations:
        if agg.function == "count":
            value = F.lit(1)
        else:
            assert agg.field is not None  # validated: only count has no field
            field = agg.field
            value = _signed(pipeline, field) if field in derived else F.col(f"t.`{field}`")
        columns.append(value.cast(types[agg.name]).alias(f"_in_{agg.name}"))
    columns.append(F.lit(1).cast("bigint").alias("_in__records"))
    return valid.select(*columns)


def aggregate(contributions: DataFrame, pipeline: Pipeline) -> DataFrame:
    """Contributions -> one output row per (key, window) changed in the batch (update mode)."""
    group: list[Column] = [F.col(k) for k in pipeline.keys]
    if pipeline.window is not None:
        assert pipeline.watermark_seconds is not None
        contributions = contributions.withWatermark(
            "_event_time", f"{pipeline.watermark_seconds} seconds"
        )
        size = f"{pipeline.window.size_seconds} seconds"
        slide = f"{pipeline.window.slide_seconds} seconds"
        group.append(F.window("_event_time", size, slide).alias("_window"))
    aggs: list[Column] = []
    for agg in pipeline.aggregations:
        name = f"_sum_{agg.name}" if agg.function == "avg" else agg.name
        combine = F.min if agg.function == "min" else F.max if agg.function == "max" else F.sum
        aggs.append(combine(f"_in_{agg.name}").alias(name))
    aggs.append(F.sum("_in__records").alias("_records"))
    grouped = contributions.groupBy(*group).agg(*aggs)

    out: list[Column] = [F.col(k) for k in pipeline.keys]
    if pipeline.window is not None:
        out += [
            F.col("_window.start").alias("window_start"),
            F.col("_window.end").alias("window_end"),
        ]
    for agg in pipeline.aggregations:
        if agg.function == "avg":
            out.append((F.col(f"_sum_{agg.name}") / F.col("_records")).alias(agg.name))
        else:
            out.append(F.col(agg.name))
    out += [F.col(f"_sum_{a.name}") for a in pipeline.aggregations if a.function == "avg"]
    out.append(F.col("_records"))
    return grouped.select(*out)


def build(
    spark: SparkSession,
    pipeline: Pipeline,
    bootstrap_servers: str,
    starting_offsets_json: str,
    client_settings: dict[str, str],
    checkpoint: str,
    seed: DataFrame | None = None,
    hold: bool = False,
    min_watermark_ms: int = 0,
) -> DataFrame:
    """The stream's output; ``seed`` (a stream of state rows) joins it at a cut.

    ``hold``: Kafka's place is taken by a stream that stays at the cut's offsets
    (the seed batches of a seeded epoch run first; the same checkpoint then resumes
    with Kafka). Windowed pipelines judge lateness by each batch's watermark from
    ``checkpoint``'s offset log, at least ``min_watermark_ms``.
    """
    if hold:
        raw = hold_stream(spark, starting_offsets_json)
    else:
        raw = read_kafka(spark, pipeline, bootstrap_servers, starting_offsets_json, client_settings)
    if pipeline.window is not None:
        raw = raw.crossJoin(batch_watermark.batch_watermark(spark, checkpoint, min_watermark_ms))
    contributions = record_contributions(observe_input(classify(raw, pipeline)), pipeline)
    if seed is not None:
        contributions = contributions.unionByName(seed)
    return aggregate(contributions, pipeline)
