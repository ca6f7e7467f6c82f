"""A new warm driver's training: before it serves, it runs a pipeline's whole path
(Spark's Kafka source, the judging, the windowed aggregation in RocksDB, the Delta
commits) over synthetic click events, so that the JVM's JIT has compiled that code
before the first scheduled run needs it.

    python -m jobs serve --train-events 1000000     # or PLATFORM_DRIVER_TRAIN_EVENTS

A new driver's first runs are its JIT's warm-up: the first 1M-event run took 2-3
times a later one (docs/benchmarks.md). The training runs on a broker and a
warehouse of its own, in a temporary folder that is removed afterwards: nothing
reaches the configured cluster, warehouse or Prometheus. So it needs a local Spark
master (the tasks run in the driver's JVM, which is what it trains) and the embedded
broker's Kafka distribution (``make setup`` installs it). A training that fails
leaves the driver untrained, not unusable: it says so in one line and serves. A stop
(SIGTERM, SIGINT) during the training ends it, its broker and its folder, then the
driver.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from pyspark.sql import SparkSession

from jobs import broker, faults, kafka_admin
from jobs.errors import ConfigError
from jobs.local_server import find_free_port
from jobs.pipeline.parser import pipeline_from_text
from jobs.settings import MAX_TRAIN_EVENTS, Settings
from jobs.warehouse import Location

log = logging.getLogger(__name__)

RUNS = 2  # the JIT compiles the most in the first run; 4 runs measured no better
USERS = 1_000
SPAN_S = 600
PARTITIONS = 4
# What most pipelines run: a keyed count in tumbling event-time windows.
PIPELINE = """
application_id: platform_driver_training
version: 1
source:
  topics: [clicks]
  starting_offsets: earliest
schema:
  user_id: string
  timestamp: long
keys: [user_id]
event_time:
  field: timestamp
  unit: seconds
window:
  type: tumbling
  size: 1 minute
watermark: 10 minutes
aggregations:
  - name: clicks
    function: count
processing_guarantee: exactly_once
trigger:
  mode: available-now
shuffle_partitions: 2
"""


def check(events: int, spark_master: str) -> int:
    """``events`` if a driver of ``spark_master`` can train on that many."""
    if not 0 <= events <= MAX_TRAIN_EVENTS:
        raise ConfigError(f"--train-events must be 0-{MAX_TRAIN_EVENTS:,}, got {events:,}")
    if events and not spark_master.startswith("local"):
        raise ConfigError(
            f"--train-events needs a local Spark master, not {spark_master}: the training's "
            "broker and warehouse are on this machine, where a cluster's executors cannot "
            "reach them; start the driver without it"
        )
    if events and os.environ.get(faults.ENV):
        raise ConfigError(f"--train-events with {faults.ENV} set would crash the training")
    return events


class Stopped(Exception):
    """A stop was asked for during the training."""


def train(spark: SparkSession, settings: Settings, events: int, stop: threading.Event) -> bool:
    """Run the training pipeline ``RUNS`` times over ``events`` events in all, in a
    session of its own; whether it ran to the end. ``stop`` (set by the driver's
    signal handler) ends it between runs, and stops a run's query at once."""
    if events <= 0:
        return True
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="platform-driver-training-"))
    session = spark.newSession()
    failed: list[BaseException] = []

    def training() -> None:
        try:
            _train(session, settings, events, work, stop)
        except BaseException as exc:
            failed.append(exc)

    # In a thread of its own: the main thread keeps the signal handlers (a run in
    # the main thread would take them over for its own stop, and swallow this one).
    worker = threading.Thread(target=training, name="driver-training", daemon=True)
    worker.start()
    stopping = False
    while worker.is_alive():
        worker.join(0.2)
        if stop.is_set() and not stopping:
            stopping = True
            for query in session.streams.active:
                query.stop()
    shutil.rmtree(work, ignore_errors=True)
    seconds = time.monotonic() - started
    if stop.is_set():
        print(f"training stopped after {seconds:.1f} s", flush=True)
        return False
    if failed:  # the driver serves untrained: slower, never wrong
        log.warning("training failed after %.1f s", seconds, exc_info=failed[0])
        print(
            f"warning: the driver serves untrained, its training failed: {failed[0]!r}", flush=True
        )
        return False
    print(f"trained on {events:,} events in {seconds:.1f} s", flush=True)
    return True


def _train(
    spark: SparkSession, settings: Settings, events: int, work: Path, stop: threading.Event
) -> None:
    from jobs.streaming.run import run_pipeline

    if stop.is_set():
        raise Stopped()
    info = broker.start(work / "broker", find_free_port())
    try:
        scratch = dataclasses.replace(
            settings,
            bootstrap_servers=info.bootstrap_servers,
            kafka_client={},
            warehouse=Location.parse(work / "warehouse"),
            metrics_port=None,
            pushgateway_url=None,
        )
        pipeline = pipeline_from_text(work / "training.yaml", PIPELINE)
        config = kafka_admin.client_config(info.bootstrap_servers)
        kafka_admin.create_topic(kafka_admin.admin(config), "clicks", PARTITIONS)
        for run in range(RUNS):
            share = events // RUNS + (1 if run < events % RUNS else 0)
            kafka_admin.produce_all(config, "clicks", click_records(share, run))
            if stop.is_set():
                raise Stopped()
            began = time.monotonic()
            run_pipeline(spark, pipeline, scratch, "available-now")
            log.info("training run %d: %d events, %.1f s", run, share, time.monotonic() - began)
    finally:
        broker.stop(work / "broker")


def click_records(count: int, seed: int) -> Iterator[tuple[bytes | None, bytes, int | None]]:
    """``count`` clicks of ``USERS`` users over the last ``SPAN_S`` seconds."""
    now = int(time.time())
    for i in range(count):
        user = f"u{(i * 7919 + seed) % USERS}"
        stamp = now - SPAN_S + (i * 104729 + seed) % SPAN_S
        yield user.encode(), json.dumps({"user_id": user, "timestamp": stamp}).encode(), None
