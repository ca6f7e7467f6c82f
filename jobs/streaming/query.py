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
) -> DataFrame:
    reader = (
        spark.readStream.format(FORMAT)
        .option("subscribe", ",".join(pipeline.topics))
        .option("startingOffsets", starting_offsets_json)
        .option("kafka.bootstrap.servers", bootstrap_servers)
    )
    for key, value in client_settings.items():
        reader = reader.option(f"kafka.{key}", value)
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


def aggregate(classified: DataFrame, pipeline: Pipeline) -> DataFrame:
    """Valid rows -> one output row per (key, window) changed in the batch (update mode)."""
    columns = [F.col(f"t.`{k}`").alias(k) for k in pipeline.keys]
    columns.append(event_time(pipeline).alias("_event_time"))
    fields = {a.field for a in pipeline.aggregations if a.field} - {
        d.name for d in pipeline.derived
    }
    columns += [F.col(f"t.`{f}`").alias(f) for f in sorted(fields)]
    for derived in pipeline.derived:
        sign = F.lit(0)
        for category, factor in derived.signs.items():
            sign = F.when(F.col(f"t.`{derived.sign_by}`") == category, F.lit(factor)).otherwise(
                sign
            )
        columns.append((F.col(f"t.`{derived.field}`") * sign).alias(derived.name))
    valid = classified.filter(F.col("_reason").isNull()).select(*columns)

    group: list[Column] = [F.col(k) for k in pipeline.keys]
    if pipeline.window is not None:
        assert pipeline.watermark_seconds is not None
        valid = valid.withWatermark("_event_time", f"{pipeline.watermark_seconds} seconds")
        size = f"{pipeline.window.size_seconds} seconds"
        slide = f"{pipeline.window.slide_seconds} seconds"
        group.append(F.window("_event_time", size, slide).alias("_window"))
    aggs: list[Column] = []
    for agg in pipeline.aggregations:
        if agg.function == "count":
            aggs.append(F.count(F.lit(1)).alias(agg.name))
        else:
            assert agg.field is not None  # validated: only count has no field
            if agg.function == "avg":
                aggs.append(F.sum(agg.field).alias(f"_sum_{agg.name}"))
            else:
                aggs.append(getattr(F, agg.function)(agg.field).alias(agg.name))
    aggs.append(F.count(F.lit(1)).alias("_records"))
    grouped = valid.groupBy(*group).agg(*aggs)

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
) -> DataFrame:
    raw = read_kafka(spark, pipeline, bootstrap_servers, starting_offsets_json, client_settings)
    classified = observe_input(classify(raw, pipeline))
    return aggregate(classified, pipeline)
