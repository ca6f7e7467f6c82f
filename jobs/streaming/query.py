"""The streaming query of a pipeline: Kafka -> records -> stateful aggregation.

Each record is aggregated, filtered or dead-lettered (``judging.py``). The input
side is observed per batch (counts and the dead letters themselves, see
``observed.py``) so that the source is read once: a union of a dead-letter
branch with the aggregation would scan Kafka twice.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.kafka_source import spark_kafka
from jobs.pipeline.model import HLL_LG_K, stored_column
from jobs.resolution import Resolved
from jobs.state_seed import RECORDS, contribution, sketch_input
from jobs.streaming import batch_clock, enrichment, judging
from jobs.streaming.seed import hold_stream, seed_stream
from jobs.warehouse import Location


def read_kafka(
    spark: SparkSession,
    resolved: Resolved,
    bootstrap_servers: str,
    starting_offsets_json: str,
    client_settings: dict[str, str],
) -> DataFrame:
    """The pipeline's topics with Spark's own Kafka source, from the epoch's cut
    (``startingOffsets`` names every partition; later partitions start at their
    earliest offset)."""
    pipeline = resolved.pipeline
    reader = spark.readStream.format(spark_kafka.FORMAT)
    for key, value in spark_kafka.source_options(bootstrap_servers, client_settings).items():
        reader = reader.option(key, value)
    reader = reader.option("subscribe", ",".join(pipeline.topics)).option(
        "startingOffsets", starting_offsets_json
    )
    if pipeline.max_offsets_per_trigger is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(pipeline.max_offsets_per_trigger))
    if resolved.uses_headers:
        reader = reader.option("includeHeaders", "true")
    return reader.load()


def aggregate(contributions: DataFrame, resolved: Resolved) -> DataFrame:
    """Contributions -> one output row per (key, window) changed in the batch (update mode).

    A hopping window is grouped by its last pane, the tumbling window of one slide
    its ``_event_time`` rows fall in (``judging.contributions``), and published as
    the window ending with it: seeded from the ``state`` table, a row then lands in
    its own window only, where Spark's hopping windows would put it in several.
    Spark's watermark delay grows by size - slide, the shift of the last window's
    rows: its watermark stays the newest event time minus the pipeline's delay, and
    a window's state is still dropped when the watermark passes its end.
    """
    pipeline = resolved.pipeline
    group: list[Column] = [F.col(k) for k in pipeline.keys]
    window = pipeline.window
    shift = 0 if window is None else window.size_seconds - window.slide_seconds
    if window is not None:
        assert pipeline.watermark_seconds is not None
        contributions = contributions.withWatermark(
            "_event_time", f"{pipeline.watermark_seconds + shift} seconds"
        )
        pane = f"{window.slide_seconds} seconds"  # (a tumbling window's size)
        group.append(F.window("_event_time", pane, pane).alias("_window"))
    aggs: list[Column] = []
    for agg in pipeline.aggregations:
        added = F.col(contribution(agg))
        if agg.function == "approx_count_distinct":
            # Records' values into one sketch, seeded sketches into a union of them.
            # The union with itself marks every stored sketch as merged: its estimate
            # then depends on its registers only (DataSketches' HIP estimate of a
            # sketch updated in order would differ from the same sketch restored).
            union = F.hll_union(
                F.hll_sketch_agg(F.col(sketch_input(agg)), HLL_LG_K), F.hll_union_agg(added)
            )
            stored = F.hll_union(union, union)
        elif agg.function in ("min", "max"):
            stored = F.min(added) if agg.function == "min" else F.max(added)
        else:
            stored = F.sum(added)
        aggs.append(stored.alias(stored_column(agg)))
    aggs.append(F.sum(RECORDS).alias("_records"))
    grouped = contributions.groupBy(*group).agg(*aggs)

    out: list[Column] = [F.col(k) for k in pipeline.keys]
    if window is not None:
        start = F.col("_window.start")
        if shift:
            size_us = window.size_seconds * 1_000_000
            start = F.timestamp_micros(F.unix_micros(F.col("_window.end")) - F.lit(size_us))
        out += [start.alias("window_start"), F.col("_window.end").alias("window_end")]
    for agg in pipeline.aggregations:
        stored = F.col(stored_column(agg))
        if agg.function == "avg":
            average = stored / F.col("_records")
            out.append(average.cast(str(resolved.value_type(agg.name))).alias(agg.name))
        elif agg.function == "approx_count_distinct":
            out.append(F.hll_sketch_estimate(stored).alias(agg.name))
        else:
            out.append(stored.alias(agg.name))
    out += [F.col(c) for c in pipeline.value_columns[len(pipeline.aggregations) : -1]]
    out.append(F.col("_records"))
    return grouped.select(*out)


def build(
    spark: SparkSession,
    resolved: Resolved,
    bootstrap_servers: str,
    starting_offsets_json: str,
    client_settings: dict[str, str],
    checkpoint: str,
    seed_path: Location | None = None,
    hold: bool = False,
    min_watermark_ms: int = 0,
    replays: list[tuple[Any, ...]] | None = None,
) -> DataFrame:
    """The stream's output; the seed at ``seed_path`` (state rows) joins it at a cut.

    ``hold``: Kafka's place is taken by a stream that stays at the cut's offsets
    (the seed batches of a seeded epoch run first; the same checkpoint then resumes
    with Kafka). Each batch judges by its time and its watermark (windowed pipelines:
    lateness) from ``checkpoint``'s offset log, the watermark at least
    ``min_watermark_ms``. ``replays``: ranges earlier batches judged
    (``table_versions.merged``), which join the tables' versions recorded there.
    """
    if not hold:
        raw = read_kafka(spark, resolved, bootstrap_servers, starting_offsets_json, client_settings)
    else:
        raw = hold_stream(spark, starting_offsets_json)
    seed = seed_stream(spark, resolved, seed_path) if seed_path is not None else None
    raw = raw.crossJoin(batch_clock.batch_clock(spark, checkpoint, min_watermark_ms))
    for table in enrichment.pinned(spark, resolved, checkpoint):
        raw = raw.crossJoin(table)
    raw = enrichment.replayed(spark, resolved, raw, replays or [])
    added = judging.contributions(judging.observe_input(judging.classify(raw, resolved)), resolved)
    if seed is not None:
        added = added.unionByName(seed)
    return aggregate(added, resolved)
