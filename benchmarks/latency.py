"""Event-to-Delta latency of a continuous run: ``user_clicks`` with a 1 s trigger
while a producer writes ``--rate`` events/s for ``--seconds``.

    .venv/bin/python -m benchmarks.latency [--rate 10000] [--seconds 60]

An event's latency is the time of its batch's ledger commit in the Delta log (the
batch is in Delta, exactly once) minus the event's Kafka timestamp (set by the
producer when it sends). (The ledger row's ``commit_time`` is when the batch
began, so it is not used.) Every event is counted: after the run each record's timestamp is read
back and matched to the batch whose offset range holds it. Writes its section of
docs/benchmarks.md. Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from confluent_kafka import Consumer, Producer, TopicPartition
from deltalake import DeltaTable

from benchmarks.report import machine, scratch_broker, write_section
from jobs import kafka_admin
from jobs.pipeline.parser import load_pipeline
from jobs.settings import load_settings
from jobs.streaming.run import run_pipeline
from jobs.streaming.spark import get_spark


def produce_at(config: dict[str, str], rate: int, seconds: int) -> int:
    producer = Producer({**config, "linger.ms": 5})
    sent = 0
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        due = int((time.monotonic() - started) * rate)
        while sent < due:
            now = int(time.time())
            value = json.dumps({"user_id": f"u{sent % 5000}", "timestamp": now}).encode()
            producer.produce("clicks", value)
            sent += 1
        producer.poll(0)
        time.sleep(0.005)
    producer.flush(30)
    return sent


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


def latencies(
    config: dict[str, Any],
    ledger: list[dict[str, Any]],
    since: float,
    commits: dict[tuple[int, int], float],
) -> tuple[list[float], list[float]]:
    """Per event: its batch's ledger commit time - its Kafka timestamp (seconds)."""
    consumer = {
        **config,
        "group.id": "latency-benchmark",
        "enable.auto.commit": False,
        "auto.offset.reset": "error",
    }
    result: list[float] = []
    measured: list[float] = []
    for row in ledger:
        start = json.loads(row["start_offsets"] or "{}")
        committed = commits[(int(row["epoch"]), int(row["batch_id"]))]
        for topic, parts in json.loads(row["end_offsets"]).items():
            for part, end in parts.items():
                begin = start.get(topic, {}).get(part, end)
                if end <= begin:
                    continue
                stamps = np.array(kafka_timestamps(consumer, topic, int(part), begin, end))
                result += list(committed - stamps)
                measured += list(committed - stamps[stamps >= since])
    return result, measured


def kafka_timestamps(
    config: dict[str, Any], topic: str, partition: int, begin: int, end: int
) -> list[float]:
    """The Kafka timestamps (seconds) of the records at offsets [begin, end)."""
    consumer = Consumer(config)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rate", type=int, default=10_000)
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--warm-up", type=int, default=15)
    parser.add_argument(
        "--interval", type=int, default=1, help="trigger interval, s (0: as fast as it can)"
    )
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    with scratch_broker("bench-latency-") as (work, info):
        settings = dataclasses.replace(
            load_settings(), bootstrap_servers=info.bootstrap_servers, warehouse=work / "wh"
        )
        config = kafka_admin.client_config(info.bootstrap_servers)
        kafka_admin.create_topic(kafka_admin.admin(config), "clicks", 4)
        pipeline = dataclasses.replace(
            load_pipeline("user_clicks", settings.pipelines_dir),
            trigger_mode="continuous",
            trigger_interval_seconds=args.interval,
        )
        spark = get_spark("local[2]", "benchmark-latency")
        stream = threading.Thread(target=run_pipeline, args=(spark, pipeline, settings))
        stream.start()
        time.sleep(5)  # the query is up and idle
        sent = produce_at(config, args.rate, args.warm_up)  # Spark's first batches are cold
        since = time.time()
        sent += produce_at(config, args.rate, args.seconds)
        ledger_path = Path(settings.warehouse / "user_clicks" / "_ledger")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            rows = DeltaTable(str(ledger_path)).to_pyarrow_table().to_pylist()
            if sum(int(r["records_in"] or 0) for r in rows if r["entry_type"] == "batch") >= sent:
                break
            time.sleep(1)
        for query in spark.streams.active:
            query.stop()
        stream.join()
        batches = [r for r in rows if r["entry_type"] == "batch" and r["records_in"]]
        commits = ledger_commit_times(ledger_path)
        values, measured = latencies(config, batches, since, commits)
        spark.stop()
    report = render(args, sent, batches, values, measured)
    print(report)
    if not args.no_write:
        write_section(report)


def render(
    args: argparse.Namespace,
    sent: int,
    batches: list[dict[str, Any]],
    values: list[float],
    measured: list[float],
) -> str:
    seconds = [json.loads(b["details"])["seconds"] for b in batches]
    every, steady = np.array(values), np.array(measured)
    lines = [
        "## Event-to-Delta latency, continuous run",
        "",
        f"Command: `.venv/bin/python -m benchmarks.latency --rate {args.rate} "
        f"--seconds {args.seconds} --warm-up {args.warm_up} --interval {args.interval}`",
        "",
        f"Machine: {machine()}; the producer, the broker and Spark share the two cores. "
        f"`user_clicks`, trigger every {args.interval} s, {sent:,} events at {args.rate:,}/s; "
        "latency = the time of the ledger commit of the event's batch (from the Delta log) "
        "minus the event's Kafka timestamp, "
        f"for every event. The first {args.warm_up} s warm the JVM and are reported apart.",
        "",
        "| events | count | p50 s | p95 s | p99 s | max s |",
        "|---|---|---|---|---|---|",
        f"| after the warm-up | {len(steady):,} | {np.percentile(steady, 50):.2f} "
        f"| {np.percentile(steady, 95):.2f} | {np.percentile(steady, 99):.2f} "
        f"| {steady.max():.2f} |",
        f"| all, warm-up included | {len(every):,} | {np.percentile(every, 50):.2f} "
        f"| {np.percentile(every, 95):.2f} | {np.percentile(every, 99):.2f} "
        f"| {every.max():.2f} |",
        "",
        f"{len(batches)} batches with records; batch seconds p50 "
        f"{statistics.median(seconds):.2f}, max {max(seconds):.2f}.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
