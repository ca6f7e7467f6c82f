"""What decoding a record costs, each way Spark offers, on the same 1,000,000 click
records (``{"user_id": "u17", "timestamp": 1700000000}``, Kafka's columns, cached in
memory): the platform's judging (``judging.classify``: ``from_json``, the checks
that make a dead letter, the event time) against each decoder alone.

    .venv/bin/python -m benchmarks.decoding [--events 1000000] [--runs 5]

Each way is a projection written to Spark's ``noop`` sink (every column computed,
nothing stored) in one warm ``local[2]`` session: 2 untimed runs, then ``--runs``
timed ones; the table has their median. The first row reads the cached bytes only.
Writes its section of docs/benchmarks.md. Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from benchmarks.report import machine, table, write_section
from jobs.pipeline.parser import load_pipeline
from jobs.settings import REPO_ROOT
from jobs.streaming import analyser, judging
from jobs.streaming.spark import get_spark

FIELDS = {"user_id": "string", "timestamp": "bigint"}
DDL = ", ".join(f"`{name}` {kind}" for name, kind in FIELDS.items())


def records(spark: SparkSession, events: int) -> DataFrame:
    """Kafka's columns over ``events`` click records, cached."""
    now_ms = int(time.time() * 1000)
    value = F.to_json(
        F.struct(
            F.concat(F.lit("u"), (F.col("id") % 1000).cast("string")).alias("user_id"),
            (F.lit(now_ms // 1000 - 600) + F.col("id") % 600).alias("timestamp"),
        )
    )
    raw = spark.range(events, numPartitions=4).select(
        F.lit("clicks").alias("topic"),
        (F.col("id") % 4).cast("int").alias("partition"),
        F.col("id").alias("offset"),
        F.timestamp_millis(F.lit(now_ms)).alias("timestamp"),
        F.lit(None).cast("binary").alias("key"),
        value.cast("binary").alias("value"),
    )
    raw = raw.cache()
    raw.count()
    return raw


def ways(spark: SparkSession) -> dict[str, Callable[[DataFrame], DataFrame]]:
    text = F.col("value").cast("string")
    pipeline = load_pipeline("user_clicks", REPO_ROOT / "include" / "pipelines")
    resolved = analyser.resolve(spark, pipeline)
    options = {"mode": "PERMISSIVE"}
    schema = DDL + ", `_corrupt_record` string"

    def judged(raw: DataFrame) -> DataFrame:
        classified = judging.classify(raw, resolved)
        return classified.select("user_id", "_event_us", "_reason", "_filtered")

    def variant(raw: DataFrame) -> DataFrame:
        parsed = raw.select(F.try_parse_json(text).alias("v"))
        return parsed.select(
            *(F.try_variant_get("v", f"$.{n}", k).alias(n) for n, k in FIELDS.items())
        )

    return {
        "the cached bytes only (`length(value)`)": lambda raw: raw.select(F.length("value")),
        "`from_json`, the schema and PERMISSIVE mode (the platform's parse)": lambda raw: (
            raw.select(F.from_json(text, schema, options).alias("t")).select("t.*")
        ),
        "`get_json_object`, a path per field": lambda raw: raw.select(
            *(F.get_json_object(text, f"$.{n}").cast(k).alias(n) for n, k in FIELDS.items())
        ),
        "`json_tuple`, the fields in one pass": lambda raw: raw.select(
            F.json_tuple(text, *FIELDS).alias(*FIELDS)
        ),
        "VARIANT: `try_parse_json`, `try_variant_get` per field": variant,
        "the platform's judging (`judging.classify`)": judged,
    }


def timed(frame: DataFrame) -> float:
    began = time.perf_counter()
    frame.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    spark = get_spark("local[2]", "bench-decoding")
    raw = records(spark, args.events)
    results: dict[str, list[float]] = {}
    for name, way in ways(spark).items():
        frame = way(raw)
        for _ in range(2):
            timed(frame)
        results[name] = [timed(frame) for _ in range(args.runs)]
        print(name, [round(s, 3) for s in results[name]], flush=True)
    spark.stop()
    base = statistics.median(next(iter(results.values())))
    rows = []
    for name, seconds in results.items():
        median = statistics.median(seconds)
        rows.append(
            [
                name,
                f"{median:.2f}",
                f"{max(median - base, 0.0):.2f}",
                f"{args.events / median / 1e6:.2f}",
            ]
        )
    lines = [
        "## Decoding a record: each way Spark offers, and the platform's judging",
        "",
        f"Command: `.venv/bin/python -m benchmarks.decoding --events {args.events} "
        f"--runs {args.runs}`",
        "",
        f"Machine: {machine()}. {args.events:,} click records in Kafka's columns, cached, "
        "4 partitions, one warm `local[2]` session; each way written to the `noop` sink, "
        f"median of {args.runs} runs after 2 untimed ones. Beyond the bytes: the median "
        "less the first row's.",
        "",
        *table(["way", "seconds", "beyond the bytes s", "M records/s"], rows),
    ]
    report = "\n".join(lines)
    print(report)
    if not args.no_write:
        write_section(report)


if __name__ == "__main__":
    main()
