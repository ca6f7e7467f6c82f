"""Running a pipeline's streaming query: the ``run`` command and ``spark-submit``."""

from __future__ import annotations

import json
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from deltalake import DeltaTable
from pyspark.sql import SparkSession

from jobs import kafka_admin
from jobs.delta import layout as tables
from jobs.delta.layout import AppLayout
from jobs.delta.writer import table_epoch
from jobs.kafka_source import offsets as plan
from jobs.lock import application_lock
from jobs.pipeline import Pipeline
from jobs.settings import Settings
from jobs.streaming import query
from jobs.streaming.batch import BatchCommitter, BatchResult


@dataclass
class RunSummary:
    application_id: str
    epoch: int
    batches: list[BatchResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def records_in(self) -> int:
        return sum(int(b.ledger.get("records_in", 0)) for b in self.batches if not b.skipped)


def current_epoch(layout: AppLayout) -> int:
    """The application's epoch: the fence on its ledger (0 before any bump)."""
    ledger = layout.table(tables.LEDGER)
    if not DeltaTable.is_deltatable(str(ledger)):
        return 0
    return max(0, table_epoch(DeltaTable(str(ledger)), layout.application_id))


def epoch_start_file(layout: AppLayout, epoch: int) -> Path:
    return layout.checkpoints / f"epoch={epoch}.json"


def epoch_starting_offsets(
    layout: AppLayout, pipeline: Pipeline, settings: Settings
) -> dict[str, Any]:
    """The offsets epoch ``n`` starts from, fixed once so every restart agrees.

    For a new application they come from the pipeline's ``starting_offsets``
    resolved against the broker now; maintenance operations write their own cut.
    """
    epoch = current_epoch(layout)
    path = epoch_start_file(layout, epoch)
    if path.exists():
        data: dict[str, Any] = json.loads(path.read_text())
        return dict(data["starting_offsets"])
    config = kafka_admin.client_config(settings.bootstrap_servers, settings.kafka_client)
    partitions = kafka_admin.topic_partitions(kafka_admin.admin(config), pipeline.topics)
    marks = kafka_admin.watermarks(
        config, [(t, p) for t, parts in partitions.items() for p in parts]
    )
    start = plan.resolve_starting_offsets(pipeline.starting_offsets, partitions, marks)
    offsets = plan.to_json_dict(start)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"epoch": epoch, "starting_offsets": offsets, "origin": "pipeline"}))
    tmp.rename(path)  # atomic: a crash leaves either no file or a whole one
    return offsets


def run_pipeline(
    spark: SparkSession,
    pipeline: Pipeline,
    settings: Settings,
    trigger: str | None = None,
) -> RunSummary:
    """Run until the input available at start is processed (available-now), or until
    stopped (continuous: SIGTERM/SIGINT stop it between batches)."""
    layout = AppLayout(settings.warehouse, pipeline.application_id)
    with application_lock(layout, f"run --trigger {trigger or pipeline.trigger_mode}"):
        return _run_locked(spark, pipeline, settings, layout, trigger)


def _run_locked(
    spark: SparkSession,
    pipeline: Pipeline,
    settings: Settings,
    layout: AppLayout,
    trigger: str | None,
) -> RunSummary:
    started = time.monotonic()
    tables.ensure_tables(layout, pipeline)
    epoch = current_epoch(layout)
    starting = epoch_starting_offsets(layout, pipeline, settings)
    checkpoint = layout.checkpoint(epoch)
    name = f"{pipeline.application_id}_epoch{epoch}"
    spark.conf.set("spark.sql.shuffle.partitions", str(pipeline.shuffle_partitions))
    stream = query.build(
        spark, pipeline, settings.bootstrap_servers, json.dumps(starting), settings.kafka_client
    )
    committer = BatchCommitter(spark, pipeline, layout, epoch, checkpoint, starting, name)
    writer = (
        stream.writeStream.queryName(name)
        .outputMode("update")
        .foreachBatch(committer)
        .option("checkpointLocation", str(checkpoint))
    )
    mode = trigger or pipeline.trigger_mode
    if mode == "available-now":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{pipeline.trigger_interval_seconds} seconds")
    running = writer.start()
    stop_requested = threading.Event()

    def request_stop(_signum: int, _frame: FrameType | None) -> None:
        stop_requested.set()

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, request_stop)
    try:
        while not running.awaitTermination(1):
            if stop_requested.is_set():
                running.stop()
        running.awaitTermination()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return RunSummary(pipeline.application_id, epoch, committer.results, time.monotonic() - started)
