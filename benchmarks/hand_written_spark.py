"""The Spark job a user would write instead of adopting the platform: clicks per
user per 1-minute tumbling window, as Spark's and Delta's guides show it. Kafka
-> ``from_json`` -> watermark -> window count (RocksDB state) -> ``foreachBatch``
MERGE into a Delta table, made idempotent with ``txnAppId``/``txnVersion``, and an
available-now trigger. Nothing of the platform runs here: no ledger, no dead
letters, no lineage, no changelog table, no checks. The engine settings are the
platform's (``benchmarks/anchors.py`` passes its jars and JVM options, as a user
passes them to ``spark-submit``), so the two differ only in what they do.

    python benchmarks/hand_written_spark.py --bootstrap-servers HOST:PORT --topic clicks
        --table DIR --checkpoint DIR --jars A.jar,B.jar [--driver-java-options "..."]
        [--sink noop]

``--sink noop``: the same query into Spark's ``noop`` sink, no table: the floor of
any Spark job of this kind, what a cold process spends before it writes anything.

Prints one JSON line: seconds from the process start to the session, the query's
start and its end.
"""

from __future__ import annotations

import argparse
import json
import time

STARTED = time.monotonic()

from delta.tables import DeltaTable  # noqa: E402  (the clock starts before the imports)
from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

SCHEMA = "user_id STRING, timestamp LONG"


def session(jars: str, java_options: str) -> SparkSession:
    return (
        SparkSession.builder.master("local[2]")
        .appName("hand_written_clicks")
        .config("spark.jars", jars)
        .config("spark.driver.extraClassPath", jars.replace(",", ":"))
        .config("spark.driver.memory", "2g")
        .config("spark.driver.extraJavaOptions", java_options)
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config(
            "spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog"
        )
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
        .config("spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows", "false")
        # As the platform: no batch without records after the last (in update mode it
        # only drops closed windows from the state; the next run's first batch does).
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--table", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--jars", required=True)
    parser.add_argument("--driver-java-options", default="")
    parser.add_argument("--sink", choices=("delta", "noop"), default="delta")
    args = parser.parse_args()

    spark = session(args.jars, args.driver_java_options)
    spark.sparkContext.setLogLevel("ERROR")
    ready = time.monotonic() - STARTED
    if args.sink == "delta":
        DeltaTable.createIfNotExists(spark).location(args.table).addColumn(
            "user_id", "STRING"
        ).addColumn("window_start", "TIMESTAMP").addColumn("window_end", "TIMESTAMP").addColumn(
            "clicks", "BIGINT"
        ).execute()

    counts = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", args.bootstrap_servers)
        .option("subscribe", args.topic)
        .option("startingOffsets", "earliest")
        .option("kafka.isolation.level", "read_committed")
        # The platform's fetch settings: they make any Spark read of Kafka faster.
        .option("kafka.max.poll.records", "10000")
        .option("kafka.max.partition.fetch.bytes", str(4 << 20))
        .load()
        .select(F.from_json(F.col("value").cast("string"), SCHEMA).alias("e"))
        .select("e.user_id", F.timestamp_seconds("e.timestamp").alias("event_time"))
        .withWatermark("event_time", "10 minutes")
        .groupBy(F.window("event_time", "1 minute"), "user_id")
        .count()
        .select(
            "user_id",
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            F.col("count").alias("clicks"),
        )
    )

    def upsert(batch: DataFrame, batch_id: int) -> None:
        # Delta's idempotent writes: a replayed batch id is skipped by the table.
        batch.sparkSession.conf.set("spark.databricks.delta.write.txnAppId", "hand_written")
        batch.sparkSession.conf.set("spark.databricks.delta.write.txnVersion", str(batch_id))
        (
            DeltaTable.forPath(batch.sparkSession, args.table)
            .alias("t")
            .merge(
                batch.alias("s"),
                "t.user_id = s.user_id AND t.window_start = s.window_start",
            )
            .whenMatchedUpdateAll()
            .whenNotMatchedInsertAll()
            .execute()
        )

    def discard(batch: DataFrame, batch_id: int) -> None:
        batch.write.format("noop").mode("append").save()

    query = (
        counts.writeStream.outputMode("update")
        .foreachBatch(upsert if args.sink == "delta" else discard)
        .option("checkpointLocation", args.checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    started = time.monotonic() - STARTED
    query.awaitTermination()
    done = time.monotonic() - STARTED
    print(json.dumps({"session_s": ready, "query_s": started, "done_s": done}), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
