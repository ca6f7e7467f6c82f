"""Event-to-result latency under a steady load, in one sitting on one broker: the
platform's continuous run of ``user_clicks`` (one row per ``--intervals`` trigger
interval) and Kafka Streams' ``ClickCounts`` (``exactly_once_v2``, a 100 ms
commit interval), each while a producer writes ``--rate`` events/s for
``--seconds`` after ``--warm-up`` seconds that warm its JVM.

    .venv/bin/python -m benchmarks.latency [--rate 10000] [--seconds 60]
        [--warm-up 15] [--intervals 1,0] [--systems platform,kafka-streams,spark-floor]

An event's latency is when its effect became durable and visible minus its Kafka
timestamp (set by the producer when it sends):
- the platform: the time of the ledger commit (in the Delta log) of the batch
  whose offset range holds it: the batch is in Delta, exactly once. (The ledger
  row's ``commit_time`` is when the batch began, so it is not used.)
- Kafka Streams: the time its committed input offset passed it: the transaction
  that holds its count (and that offset) had committed, and a read_committed
  consumer sees the count. Polled every 10 ms, so at most about 10 ms late.
The platform's runs share one process and JVM, after an untimed run that warms it.
Every event is counted: its timestamp is read back from Kafka and matched to the
first commit that covers its offset. Also measured, under the same load: the
floor of a micro-batch on this machine, the batches of the smallest query of the
platform's kind (Kafka -> ``from_json`` -> a window count in RocksDB ->
``foreachBatch`` into Spark's ``noop`` sink, triggers back to back). Also probed:
whether Spark's asynchronous progress tracking and real-time mode start the
platform's kind of query (an aggregation into ``foreachBatch``). Writes its section
of docs/benchmarks.md. Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from confluent_kafka import Consumer, Producer, TopicPartition
from deltalake import DeltaTable
from pyspark.sql import functions as F

from benchmarks.anchors import kafka_streams_classpath
from benchmarks.report import machine, scratch_broker, table, write_section
from jobs import kafka_admin
from jobs.broker import BrokerInfo
from jobs.kafka_source import spark_kafka
from jobs.pipeline.parser import load_pipeline
from jobs.settings import load_settings
from jobs.streaming.run import run_pipeline
from jobs.streaming.spark import get_spark

PARTITIONS = 4
KS_COMMIT_MS = 100
# (seconds, partition -> the end offset committed by then), in time order.
Timeline = list[tuple[float, dict[int, int]]]


@dataclasses.dataclass
class Measured:
    name: str
    topic: str
    sent: int
    since: float  # the end of the warm-up (epoch seconds)
    timeline: Timeline
    note: str = ""


def produce_at(config: dict[str, str], topic: str, rate: int, seconds: int) -> int:
    producer = Producer({**config, "linger.ms": 5})
    sent = 0
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        due = int((time.monotonic() - started) * rate)
        while sent < due:
            now = int(time.time())
            value = json.dumps({"user_id": f"u{sent % 5000}", "timestamp": now}).encode()
            producer.produce(topic, value)
            sent += 1
        producer.poll(0)
        time.sleep(0.005)
    producer.flush(30)
    return sent


def under_load(
    config: dict[str, str], topic: str, args: argparse.Namespace, covered: Callable[[int], bool]
) -> tuple[int, float]:
    """Warm-up, then the measured load; waits (up to 120 s) until ``covered(sent)``.
    (events sent, the end of the warm-up)."""
    sent = produce_at(config, topic, args.rate, args.warm_up)  # a JVM's first batches are cold
    since = time.time()
    sent += produce_at(config, topic, args.rate, args.seconds)
    deadline = time.monotonic() + 120
    while not covered(sent) and time.monotonic() < deadline:
        time.sleep(0.5)
    return sent, since


def platform(
    info: BrokerInfo, work: Path, args: argparse.Namespace, interval: int, topic: str
) -> Measured:
    """A continuous run of ``user_clicks`` in this process, on ``topic`` (new)."""
    warehouse = work / f"wh-{topic}"
    settings = dataclasses.replace(
        load_settings(), bootstrap_servers=info.bootstrap_servers, warehouse=warehouse
    )
    config = kafka_admin.client_config(info.bootstrap_servers)
    kafka_admin.create_topic(kafka_admin.admin(config), topic, PARTITIONS)
    pipeline = dataclasses.replace(
        load_pipeline("user_clicks", settings.pipelines_dir),
        topics=(topic,),
        trigger_mode="continuous",
        trigger_interval_seconds=interval,
    )
    spark = get_spark("local[2]", "benchmark-latency")
    stream = threading.Thread(target=run_pipeline, args=(spark, pipeline, settings))
    stream.start()
    time.sleep(5)  # the query is up and idle
    ledger = warehouse / "user_clicks" / "_ledger"

    def committed() -> int:
        if not (ledger / "_delta_log").is_dir():
            return 0
        rows = DeltaTable(str(ledger)).to_pyarrow_table().to_pylist()
        return sum(int(r["records_in"] or 0) for r in rows if r["entry_type"] == "batch")

    sent, since = under_load(config, topic, args, lambda sent: committed() >= sent)
    for query in spark.streams.active:
        query.stop()
    stream.join()
    rows = DeltaTable(str(ledger)).to_pyarrow_table().to_pylist()
    batches = [r for r in rows if r["entry_type"] == "batch" and r["records_in"]]
    commits = ledger_commit_times(ledger)
    timeline = sorted(
        (
            (
                commits[(int(r["epoch"]), int(r["batch_id"]))],
                {int(p): int(o) for p, o in json.loads(r["end_offsets"])[topic].items()},
            )
            for r in batches
        ),
        key=lambda commit: commit[0],
    )
    seconds = sorted(json.loads(b["details"])["seconds"] for b in batches)
    note = f"{len(batches)} batches, batch seconds p50 {seconds[len(seconds) // 2]:.2f}"
    name = (
        f"the platform, continuous, trigger every {interval} s"
        if interval
        else ("the platform, continuous, triggers back to back (interval 0)")
    )
    return Measured(name, topic, sent, since, timeline, note)


def ledger_commit_times(ledger_path: Path) -> dict[tuple[int, int], float]:
    """(epoch, batch id) -> when the ledger commit of that batch was made (seconds),
    from the Delta log: the commit's ``commitInfo`` time, found by the batch marker
    (``<app>/epoch=<e>`` at version ``<batch id>``) it carries."""
    found: dict[tuple[int, int], float] = {}
    for commit in sorted((ledger_path / "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in commit.read_text().splitlines() if line]
        stamps = [a["commitInfo"]["timestamp"] for a in actions if "commitInfo" in a]
        for action in actions:
            txn = action.get("txn")
            if txn and "/epoch=" in txn["appId"] and stamps:
                epoch = int(txn["appId"].rsplit("=", 1)[1])
                found[(epoch, int(txn["version"]))] = stamps[0] / 1000
    return found


def kafka_streams(info: BrokerInfo, work: Path, args: argparse.Namespace) -> Measured:
    """``ClickCounts`` in follow mode on topic ``ks_clicks``: its timeline is what it
    prints, a line each time its committed offsets move."""
    config = kafka_admin.client_config(info.bootstrap_servers)
    for topic in ("ks_clicks", "ks_counts"):
        kafka_admin.create_topic(kafka_admin.admin(config), topic, PARTITIONS)
    process = subprocess.Popen(
        ["java", "-cp", kafka_streams_classpath(), "ClickCounts", info.bootstrap_servers]
        + ["ks_clicks", "ks_counts", "ks-latency", str(work / "ks-state"), "2"]
        + [str(KS_COMMIT_MS), "follow"],
        stdout=subprocess.PIPE,
        text=True,
    )
    timeline: Timeline = []
    ends: dict[int, int] = {}

    def follow() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            moved = json.loads(line)
            ends.update({int(p): int(o) for p, o in moved["offsets"].items()})
            timeline.append((moved["t_ms"] / 1000, dict(ends)))

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    time.sleep(5)  # the application is up and idle
    try:
        sent, since = under_load(config, "ks_clicks", args, lambda sent: sum(ends.values()) >= sent)
    finally:
        process.terminate()
        process.wait(60)
    reader.join(10)
    name = f"Kafka Streams 4.3.1, `exactly_once_v2`, commit every {KS_COMMIT_MS} ms, 2 threads"
    return Measured(name, "ks_clicks", sent, since, timeline, f"{len(timeline)} commits seen")


def latencies(config: dict[str, Any], measured: Measured) -> tuple[Any, Any]:
    """Per event of the system's topic: the first commit of the timeline that covers its
    offset minus its Kafka timestamp (seconds); all, and those after the warm-up."""
    every: list[Any] = []
    steady: list[Any] = []
    for partition in range(PARTITIONS):
        times = np.array([t for t, ends in measured.timeline if partition in ends])
        ends = np.maximum.accumulate(
            np.array([ends[partition] for _t, ends in measured.timeline if partition in ends])
        )
        if len(ends) == 0:
            continue
        stamps = np.array(kafka_timestamps(config, measured.topic, partition, 0, int(ends[-1])))
        committed = times[np.searchsorted(ends, np.arange(len(stamps)), side="right")]
        every.append(committed - stamps)
        steady.append((committed - stamps)[stamps >= measured.since])
    return np.concatenate(every), np.concatenate(steady)


def kafka_timestamps(
    config: dict[str, Any], topic: str, partition: int, begin: int, end: int
) -> list[float]:
    """The Kafka timestamps (seconds) of the records at offsets [begin, end)."""
    consumer = Consumer({**config, "group.id": "latency-benchmark", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, partition, begin)])
    found: list[float] = []
    try:
        position = begin
        while position < end:
            messages = consumer.consume(min(10_000, end - position), 1.0)
            for message in messages:
                if message.error() is None and (message.offset() or 0) < end:
                    found.append(message.timestamp()[1] / 1000)
                    position = (message.offset() or 0) + 1
            if not messages:
                position = max(
                    position, consumer.position([TopicPartition(topic, partition)])[0].offset
                )
    finally:
        consumer.close()
    return found


def spark_floor(info: BrokerInfo, args: argparse.Namespace, work: Path) -> str:
    """The batches of the smallest query of the platform's kind under the load:
    what any micro-batch pipeline pays on this machine before it writes a byte."""
    spark = get_spark("local[2]", "benchmark-latency")
    spark.conf.set("spark.sql.shuffle.partitions", "2")  # as user_clicks
    config = kafka_admin.client_config(info.bootstrap_servers)
    kafka_admin.create_topic(kafka_admin.admin(config), "clicks_floor", PARTITIONS)
    counts = (
        spark.readStream.format("kafka")
        .options(**spark_kafka.source_options(info.bootstrap_servers, {}))  # the platform's
        .option("subscribe", "clicks_floor")
        .load()
        .selectExpr("from_json(CAST(value AS STRING), 'user_id STRING, timestamp LONG') AS e")
        .selectExpr("e.user_id", "timestamp_seconds(e.timestamp) AS t")
        .withWatermark("t", "10 minutes")
        .groupBy(F.window("t", "1 minute"), "user_id")
        .count()
    )
    query = (
        counts.writeStream.outputMode("update")
        .foreachBatch(lambda frame, _id: frame.write.format("noop").mode("overwrite").save())
        .option("checkpointLocation", str(work / "floor-checkpoint"))
        .trigger(processingTime="0 seconds")
        .start()
    )
    try:
        produce_at(config, "clicks_floor", args.rate, args.warm_up)
        warmed = len(query.recentProgress)
        produce_at(config, "clicks_floor", args.rate, args.seconds)
        batches = [p for p in query.recentProgress[warmed:] if p["numInputRows"]]
    finally:
        query.stop()
    seconds = [p["durationMs"]["triggerExecution"] / 1000 for p in batches]
    spark_job = [p["durationMs"].get("addBatch", 0) / 1000 for p in batches]
    return (
        f"{len(batches)} batches of {np.median([p['numInputRows'] for p in batches]):,.0f} "
        f"records (median): a trigger p50 {np.percentile(seconds, 50):.2f} s, p95 "
        f"{np.percentile(seconds, 95):.2f} s; of which the Spark job (`addBatch`) p50 "
        f"{np.percentile(spark_job, 50):.2f} s"
    )


def probe_modes(info: BrokerInfo, work: Path, topic: str) -> dict[str, str]:
    """Whether Spark starts an aggregation into ``foreachBatch`` (the platform's
    query) with asynchronous progress tracking, and in real-time mode: the first
    line of its refusal, or whether it ran."""
    spark = get_spark("local[2]", "benchmark-latency")
    source = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", info.bootstrap_servers)
        .option("subscribe", topic)
        .load()
        .selectExpr("CAST(value AS STRING) AS user_id", "timestamp")
        .withWatermark("timestamp", "10 minutes")
        .groupBy("user_id")
        .count()
    )
    found = {}
    for name, writer in {
        "asynchronous progress tracking": lambda w: w.option(
            "asyncProgressTrackingEnabled", "true"
        ),
        "real-time mode": lambda w: w.trigger(realTime="5 seconds"),
    }.items():
        query = None
        try:
            query = writer(
                source.writeStream.foreachBatch(lambda frame, _id: frame.count())
                .outputMode("update")
                .option("checkpointLocation", str(work / f"probe-{len(found)}"))
            ).start()
            # Refused at the start, or failing in its first batches; else it runs.
            ended = query.awaitTermination(20)
            found[name] = "ended at once" if ended else "ran for 20 s"
        except Exception as error:  # the refusal is the measurement
            found[name] = (str(error).strip().splitlines() or [type(error).__name__])[0][:500]
        finally:
            if query is not None and query.isActive:
                query.stop()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rate", type=int, default=10_000)
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--warm-up", type=int, default=15)
    parser.add_argument("--intervals", default="1,0", help="the platform's trigger intervals, s")
    parser.add_argument("--systems", default="platform,kafka-streams,spark-floor")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    systems = args.systems.split(",")
    results: list[tuple[Measured, Any, Any]] = []
    with scratch_broker("bench-latency-") as (work, info):
        config = kafka_admin.client_config(info.bootstrap_servers)
        if "kafka-streams" in systems:
            kafka_streams_classpath()  # built before any clock starts
            ks = kafka_streams(info, work, args)
            results.append((ks, *latencies(config, ks)))
        if "platform" in systems:
            # An untimed run first: every measured run finds the JVM warm, as a
            # continuous run does after its first minutes.
            platform(info, work, args, 0, "clicks_warm_up")
            for interval in (int(i) for i in args.intervals.split(",")):
                run = platform(info, work, args, interval, f"clicks_{interval}")
                results.append((run, *latencies(config, run)))
            probes = probe_modes(info, work, run.topic)
        floor = spark_floor(info, args, work) if "spark-floor" in systems else ""
    report = render(args, results, probes if "platform" in systems else {}, floor)
    print(report)
    if not args.no_write:
        write_section(report)


def render(
    args: argparse.Namespace,
    results: list[tuple[Measured, Any, Any]],
    probes: dict[str, str],
    floor: str,
) -> str:
    def pct(values: Any, q: float) -> str:
        return f"{np.percentile(values, q):.2f}"

    rows = [
        [
            m.name,
            f"{len(steady):,}",
            pct(steady, 50),
            pct(steady, 95),
            pct(steady, 99),
            f"{steady.max():.2f}",
            pct(every, 95),
            m.note,
        ]
        for m, every, steady in results
    ]
    lines = [
        "## Event-to-result latency under load: the platform and Kafka Streams",
        "",
        f"Command: `.venv/bin/python -m benchmarks.latency --rate {args.rate} "
        f"--seconds {args.seconds} --warm-up {args.warm_up} --intervals {args.intervals}`",
        "",
        f"Machine: {machine()}; the producer, the broker and the system share the cores. "
        f"One sitting, one broker; {args.rate:,} click events/s for {args.seconds} s after "
        f"{args.warm_up} s of warm-up, per-user counts per 1-minute window, exactly-once. "
        "Latency: when the event's effect was committed (the platform: its batch's ledger "
        "commit in the Delta log; Kafka Streams: the transaction that moved its committed "
        "offset past it, polled every 10 ms) minus its Kafka timestamp, for every event.",
        "",
        *table(
            [
                "system",
                "events after warm-up",
                "p50 s",
                "p95 s",
                "p99 s",
                "max s",
                "p95 s, warm-up included",
                "commits",
            ],
            rows,
        ),
    ]
    if floor:
        lines += [
            "",
            "A micro-batch's floor under the same load: the smallest query of the platform's "
            "kind (Kafka, `from_json`, a 1-minute window count in RocksDB, `foreachBatch` "
            f"into the `noop` sink, triggers back to back), no Delta: {floor}.",
        ]
    if probes:
        lines += ["", "Spark's low-latency modes, tried on the platform's kind of query:", ""]
        lines += [f"- {name}: {said}" for name, said in probes.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
