"""The streaming query of a pipeline: Kafka -> parse -> stateful aggregation.

Parsing happens in Spark (``from_json``). Every record is either valid, and goes
to the aggregation, or gets a reason and becomes a dead letter. The input side
is observed per batch (counts and the dead letters themselves, see
``observed.py``) so that the source is read once: a union of a dead-letter
branch with the aggregation would scan Kafka twice.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.kafka_source.datasource import FORMAT
from jobs.pipeline import Pipeline

OBSERVATION = "batch_input"
CORRUPT = "_corrupt_record"
SPARK_TYPES = {"string": "string", "long": "bigint", "int": "int", "double": "double"}
SPARK_TYPES["boolean"] = "boolean"


def read_kafka(
    spark: SparkSession,
    pipeline: Pipeline,
    bootstrap_servers: str,
    starting_offsets_json: str,
    client_settings: dict[str, str],
    hold_until: str | None = None,
    archive_dir: str | None = None,
) -> DataFrame:
    reader = (
        spark.readStream.format(FORMAT)
        .option("subscribe", ",".join(pipeline.topics))
        .option("startingOffsets", starting_offsets_json)
        .option("kafka.bootstrap.servers", bootstrap_servers)
    )
    for key, value in client_settings.items():
        reader = reader.option(f"kafka.{key}", value)
    if hold_until is not None:
        reader = reader.option("holdUntilFileExists", hold_until)
    if archive_dir is not None:
        reader = reader.option("archiveDir", archive_dir)
    if pipeline.max_offsets_per_trigger is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(pipeline.max_offsets_per_trigger))
    return reader.load()


def _schema_ddl(pipeline: Pipeline, as_strings: bool) -> str:
    fields = [
        f"`{name}` {'string' if as_strings else SPARK_TYPES[kind]}"
        for name, kind in pipeline.schema.items()
    ]
    return ", ".join([*fields, f"`{CORRUPT}` string"])


def classify(raw: DataFrame, pipeline: Pipeline) -> DataFrame:
    """Raw Kafka rows -> typed fields plus ``_reason`` (null when the record is valid)."""
    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}
    text = F.col("value").cast("string")
    typed = F.from_json(text, _schema_ddl(pipeline, False), options)
    parsed = raw.select(
        "topic", "partition", "offset", "key", "value", "timestamp", typed.alias("t")
    )
    checks: list[Column] = [F.col("t").isNotNull(), F.col(f"t.{CORRUPT}").isNull()]
    checks += [F.col(f"t.`{name}`").isNotNull() for name in pipeline.schema]
    for derived in pipeline.derived:
        checks.append(F.col(f"t.`{derived.sign_by}`").isin(list(derived.signs)))
    valid = checks[0]
    for check in checks[1:]:
        valid = valid & check
    # Only invalid rows pay for the second, all-strings parse that explains why.
    loose = F.from_json(text, _schema_ddl(pipeline, True), options)
    reason = F.when(F.col("value").isNull(), F.lit("value is null")).when(
        F.col("t").isNull(), F.lit("value is empty")
    )
    reason = reason.when(loose.getField(CORRUPT).isNotNull(), F.lit("not a JSON object"))
    for name in pipeline.schema:
        reason = reason.when(
            loose.getField(name).isNull(), F.lit(f"missing or null field {name!r}")
        )
    for name, kind in pipeline.schema.items():
        reason = reason.when(
            F.col(f"t.`{name}`").isNull(),
            F.concat(
                F.lit(f"field {name!r} is not a {kind}: "),
                F.substring(loose.getField(name), 1, 100),
            ),
        )
    for derived in pipeline.derived:
        allowed = ", ".join(sorted(derived.signs))
        reason = reason.when(
            ~F.col(f"t.`{derived.sign_by}`").isin(list(derived.signs)),
            F.concat(
                F.lit(f"field {derived.sign_by!r} must be one of {allowed}, got "),
                F.substring(F.col(f"t.`{derived.sign_by}`"), 1, 100),
            ),
        )
    reason = reason.otherwise(F.lit("invalid record"))
    return parsed.withColumn("_reason", F.when(valid, F.lit(None).cast("string")).otherwise(reason))


def observe_input(classified: DataFrame) -> DataFrame:
    """Per-batch input accounting, collected alongside the batch's single scan."""
    dead = F.col("_reason").isNotNull()
    return classified.observe(
        OBSERVATION,
        F.count(F.lit(1)).alias("records_in"),
        F.count_if(~dead).alias("records_valid"),
        F.count_if(dead).alias("dead_lettered"),
        F.collect_list(
            F.when(
                dead,
                F.struct(
                    "topic",
                    "partition",
                    "offset",
                    F.base64("key").alias("key"),
                    F.base64("value").alias("value"),
                    F.unix_micros("timestamp").alias("kafka_timestamp"),
                    F.col("_reason").alias("reason"),
                ),
            )
        ).alias("dead_letters"),
    )


def event_time(pipeline: Pipeline) -> Column:
    value = F.col(f"t.`{pipeline.event_time_field}`")
    if pipeline.event_time_unit == "seconds":
        return F.timestamp_micros((value * 1_000_000).cast("bigint"))
    if pipeline.event_time_unit == "milliseconds":
        return F.timestamp_micros((value * 1_000).cast("bigint"))
    return F.timestamp_micros(value.cast("bigint"))


def contribution_types(pipeline: Pipeline) -> dict[str, str]:
    """Spark type of each aggregate's per-row contribution column ``_in_<name>``.

    Aggregations are kept algebraic (count and avg become sums of contributions),
    so a state snapshot can be fed back in as rows: a seed row contributes its
    stored count, sum, min or max exactly as records would (see ``seed.py``).
    """
    from jobs.delta.layout import value_type

    spark_type = {"int64": "bigint", "double": "double", "int32": "int"}
    spark_type.update({"string": "string", "bool": "boolean"})
    types = {}
    for agg in pipeline.aggregations:
        column = f"_sum_{agg.name}" if agg.function == "avg" else agg.name
        types[agg.name] = spark_type[str(value_type(pipeline, column))]
    types["_records"] = "bigint"
    return types


def record_contributions(classified: DataFrame, pipeline: Pipeline) -> DataFrame:
    """Valid Kafka records -> keys, event time and what each adds to each aggregate."""
    valid = classified.filter(F.col("_reason").isNull())
    values: dict[str, Column] = {}
    for derived in pipeline.derived:
        sign = F.lit(0)
        for category, factor in derived.signs.items():
            sign = F.when(F.col(f"t.`{derived.sign_by}`") == category, F.lit(factor)).otherwise(
                sign
            )
        values[derived.name] = F.col(f"t.`{derived.field}`") * sign
    types = contribution_types(pipeline)
    columns = [F.col(f"t.`{k}`").alias(k) for k in pipeline.keys]
    columns.append(event_time(pipeline).alias("_event_time"))
    for agg in pipeline.aggregations:
        if agg.function == "count":
            value = F.lit(1)
        else:
            assert agg.field is not None  # validated: only count has no field
            value = values.get(agg.field, F.col(f"t.`{agg.field}`"))
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
    seed: DataFrame | None = None,
    hold_until: str | None = None,
    archive_dir: str | None = None,
) -> DataFrame:
    """The stream's output; ``seed`` (a stream of state rows) joins it at a cut."""
    raw = read_kafka(
        spark,
        pipeline,
        bootstrap_servers,
        starting_offsets_json,
        client_settings,
        hold_until,
        archive_dir,
    )
    contributions = record_contributions(observe_input(classify(raw, pipeline)), pipeline)
    if seed is not None:
        contributions = contributions.unionByName(seed)
    return aggregate(contributions, pipeline)
