"""Running a pipeline's streaming query: the ``run`` command and ``spark-submit``."""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from deltalake import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql.streaming.readwriter import DataStreamWriter

from jobs import kafka_admin
from jobs.cut import Cut, check_against_current_cut, epoch_start, seed_file
from jobs.cut import starting_offsets as start_of
from jobs.delta import layout as tables
from jobs.delta.layout import AppLayout
from jobs.delta.writer import committed_batch
from jobs.errors import ConsistencyError, FencedError, KafkaUnavailableError, PlatformError
from jobs.kafka_source import offsets as plan
from jobs.kafka_source import spark_kafka
from jobs.ledger import current_epoch, unfinished_operation
from jobs.lock import Holding, application_lock
from jobs.metrics import METRICS, push
from jobs.output.publisher import OutputPublisher, opened_publisher
from jobs.pipeline.model import Pipeline
from jobs.resolution import Resolved, store
from jobs.settings import Settings
from jobs.streaming import analyser, changelog_files, offset_log, query, table_versions
from jobs.streaming.batch import BatchCommitter, Reach, refuse_unrepaired_drops
from jobs.streaming.follow import follow
from jobs.streaming.outage import Answer, OutageClock, stop_signals, wait_for_brokers
from jobs.streaming.seed import SEEDED_MARK, absorb_seed
from jobs.streaming.spark import query_settings
from jobs.streaming.summary import RunSummary
from jobs.superseded import remove_superseded_dead_letters

log = logging.getLogger(__name__)


def preflight(pipeline: Pipeline, settings: Settings) -> None:
    """Checks that need no Spark, made before it starts (seconds saved, and no
    half-started run): the pipeline's state shape against the current epoch's.
    ``_run_locked`` checks again under the lock."""
    layout = AppLayout(settings.warehouse, pipeline.application_id)
    if not layout.table(tables.LEDGER).exists():
        return
    check_against_current_cut(layout, pipeline)


def run_pipeline(
    spark: SparkSession,
    pipeline: Pipeline,
    settings: Settings,
    trigger: str | None = None,
) -> RunSummary:
    """Run until the input available at start is processed (available-now), or until
    stopped (continuous: SIGTERM/SIGINT stop it between batches). A continuous run
    that Kafka stopped answering waits for the brokers and starts again
    (``outage.py``)."""
    changelog_files.start_workers(spark)  # while the run prepares
    resolved = analyser.resolve(spark, pipeline, settings.warehouse)
    layout = AppLayout(settings.warehouse, pipeline.application_id)
    config = kafka_admin.client_config(settings.bootstrap_servers, settings.kafka_client)
    with stop_signals() as stop:
        run = RunContext(spark, resolved, settings, layout, config, trigger, stop)
        return _run_until_stopped(run)


@dataclass(frozen=True)
class RunContext:
    """What every attempt of one run shares: the session, the resolved pipeline, the
    settings, where the application lives, the Kafka clients' settings, the trigger
    asked for, and the stop event (SIGTERM/SIGINT, ``outage.stop_signals``)."""

    spark: SparkSession
    resolved: Resolved
    settings: Settings
    layout: AppLayout
    config: dict[str, Any]
    trigger: str | None
    stop: threading.Event

    @property
    def pipeline(self) -> Pipeline:
        return self.resolved.pipeline

    @property
    def mode(self) -> str:
        return self.trigger or self.resolved.pipeline.trigger_mode


def _run_until_stopped(run: RunContext) -> RunSummary:
    settings, layout, stop, pipeline = run.settings, run.layout, run.stop, run.pipeline
    clock = OutageClock(settings.outage_wait_s if run.mode != "available-now" else 0)
    while True:
        progress_before = _committed(layout)
        try:
            return _run_once(run)
        except KafkaUnavailableError as exc:
            if stop.is_set():
                log.info("%s: stopped (Kafka did not answer: %s)", pipeline.application_id, exc)
                return RunSummary(pipeline.application_id, current_epoch(layout))
            if not (exc.while_running or clock.began is not None):
                raise  # at the run's start: more likely a wrong address than an outage
            deadline = clock.deadline(time.monotonic(), _committed(layout) != progress_before)
            if deadline is None:
                raise
            log.warning(
                "%s: Kafka did not answer (%s); nothing of the batch is committed. Waiting "
                "up to %.0f s for the brokers, then the run starts again from its checkpoint",
                pipeline.application_id,
                exc.detail,
                deadline - time.monotonic(),
            )
            waited_in = _committed(layout)[0]  # the epoch the failed attempt ran in
            answer = wait_for_brokers(run.config, pipeline.topics, deadline, stop)
            if answer is Answer.STOPPED:
                log.info("%s: stopped while waiting for Kafka", pipeline.application_id)
                return RunSummary(pipeline.application_id, current_epoch(layout))
            if answer is Answer.NONE:
                raise
            moved = _committed(layout)[0]
            if moved != waited_in:
                # An operation ran during the wait: its cut may carry another definition
                # than the one this process resolved at its start.
                raise FencedError(
                    f"{pipeline.application_id} moved to epoch {moved} while this run waited "
                    f"for Kafka; this run of epoch {waited_in} stops: start it again "
                    "(it runs what the operation left)"
                ) from None
            log.info("%s: Kafka answers again: the run starts again", pipeline.application_id)


def _committed(layout: AppLayout) -> tuple[int, int | None]:
    """(epoch, its last committed batch): what moves only when a batch commits."""
    path = layout.table(tables.LEDGER)
    if not (path / "_delta_log").is_dir():
        return (-1, None)
    epoch = current_epoch(layout)
    return epoch, committed_batch(DeltaTable(str(path)), layout.application_id, epoch)


def _run_once(run: RunContext) -> RunSummary:
    settings, layout = run.settings, run.layout
    pipeline = run.resolved.pipeline
    try:
        with application_lock(layout, f"run --trigger {run.mode}") as held:
            return _run_locked(run, held)
    except Exception as exc:
        # From foreachBatch the fence arrives wrapped in Spark's exception.
        if isinstance(exc, FencedError) or f"jobs.errors.{FencedError.__name__}" in str(exc):
            METRICS.fenced_commit(pipeline.application_id, pipeline.version)
        if not isinstance(exc, PlatformError):
            known = (
                spark_kafka.wrapped_unavailable(exc)
                or spark_kafka.data_loss_error(exc)
                or spark_kafka.unavailable_error(exc)
            )
            if known is not None:
                raise known from exc
        raise
    finally:
        # Scheduled runs report this way; a continuous one too when it ends (a fence
        # that stopped it would otherwise never be seen).
        if settings.pushgateway_url:
            push(settings.pushgateway_url, pipeline.application_id, "run")
        METRICS.unwatch_lag(pipeline.application_id)


def _run_locked(run: RunContext, held: Holding) -> RunSummary:
    """One attempt, under the application's lock: the tables ready, the epoch's cut
    checked against the pipeline and the brokers, what an operation or a crash left
    unpublished sent out, then the stream."""
    started = time.monotonic()
    resolved, layout, pipeline = run.resolved, run.layout, run.pipeline
    store(layout, resolved)  # for the tools that run without Spark
    tables.ensure_tables(layout, resolved)
    unfinished = unfinished_operation(layout)
    if unfinished is not None:
        raise ConsistencyError(
            f"{pipeline.application_id}: {unfinished.describe()}; run the same "
            f"{unfinished.operation} again to complete it (python -m jobs {unfinished.operation} "
            f"--pipeline {pipeline.application_id} ...), then run"
        )
    refuse_unrepaired_drops(layout)
    remove_superseded_dead_letters(layout)  # what a repair judges again, if not yet
    topics = kafka_admin.topics_now(run.config, pipeline.topics, run.settings.bootstrap_servers)
    cut = epoch_start(layout, pipeline, topics)
    # Opening the publisher fences an older one; what an operation or a crash left
    # unpublished goes out before the first batch.
    with opened_publisher(resolved, layout, run.config) as output:
        return _stream(run, cut, topics, output, held, started)


def _stream(
    run: RunContext,
    cut: Cut,
    topics: kafka_admin.TopicsNow,
    output: OutputPublisher | None,
    held: Holding,
    started: float,
) -> RunSummary:
    """The epoch's query from its cut: seeded first when the cut carries state,
    then Kafka, each batch committed by a ``BatchCommitter``, followed to its end."""
    spark, resolved, settings, layout = run.spark, run.resolved, run.settings, run.layout
    pipeline, epoch = resolved.pipeline, cut.epoch
    checkpoint = layout.checkpoint(epoch)
    # Only used while the epoch's checkpoint has no batch yet (Spark ignores it after).
    start = start_of(cut, topics.marks, not offset_log.offset_batches(checkpoint), topics.ids)
    starting = plan.to_json_dict(start)
    seed_path = seed_file(layout, epoch, cut.seed_digest) if cut.seed_rows is not None else None
    name = f"{pipeline.application_id}_epoch{epoch}"
    spark.conf.set("spark.sql.shuffle.partitions", str(pipeline.shuffle_partitions))
    replays = table_versions.replay_ranges(spark, resolved, layout, cut.offsets())
    committer = BatchCommitter(
        spark,
        resolved,
        layout,
        epoch,
        checkpoint,
        starting,
        name,
        settings.bootstrap_servers,
        settings.kafka_client,
        seed_path,
        watermark_floor_ms=cut.watermark_ms if pipeline.window is not None else 0,
        output=output,
        replays=replays,
        guard=held.check,
        reach=Reach(f"{pipeline.application_id} epoch {epoch}", start, topics.marks)
        if run.mode == "available-now"
        else None,
    )
    METRICS.watch_lag(
        pipeline.application_id,
        pipeline.version,
        lambda: kafka_admin.consumer_lag(run.config, committer.positions),
    )
    log.info(
        "%s: epoch %d starts from the %s cut (seeded rows: %s, watermark floor %d ms)",
        *(pipeline.application_id, epoch, cut.origin, cut.seed_rows, cut.watermark_ms),
    )

    def writer(hold: bool) -> DataStreamWriter:
        frame = query.build(
            *(spark, resolved, settings.bootstrap_servers, json.dumps(starting)),
            *(settings.kafka_client, checkpoint.spark_uri),
            seed_path=seed_path,
            hold=hold,
            min_watermark_ms=cut.watermark_ms,
            replays=replays,
        )
        return (
            frame.writeStream.queryName(name)
            .outputMode("update")
            .foreachBatch(committer)
            .option("checkpointLocation", checkpoint.spark_uri)
        )

    scheduled = run.mode == "available-now"
    interval = f"{pipeline.trigger_interval_seconds} seconds"
    trigger = {"availableNow": True} if scheduled else {"processingTime": interval}
    finished = False
    try:  # the committer's monitoring group and progress bar end however the query does
        if seed_path is not None and not (checkpoint / SEEDED_MARK).exists():
            query_settings(spark, short=True)
            absorb_seed(writer(hold=True), checkpoint)
        query_settings(spark, short=scheduled)
        running = writer(hold=False).trigger(**trigger).start()
        follow(running, committer, layout, epoch, run.stop, held)
        finished = True
    finally:
        committer.close(finished)
    return RunSummary(pipeline.application_id, epoch, committer.results, time.monotonic() - started)
