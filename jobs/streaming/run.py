"""Running a pipeline's streaming query: the ``run`` command and ``spark-submit``."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.streaming.readwriter import DataStreamWriter

from jobs import kafka_admin
from jobs.cut import (
    Cut,
    Origin,
    check_definition,
    check_state_shape,
    latest_cut,
    read_cut,
    recorded_definition,
    seed_file,
    write_cut,
)
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
from jobs.output.publisher import OutputPublisher, open_publisher
from jobs.pipeline import Pipeline
from jobs.progress import Progress
from jobs.resolved import Resolved, store
from jobs.settings import Settings
from jobs.streaming import dimensions, offset_log, query, records
from jobs.streaming.batch import BatchCommitter, BatchResult, refuse_unrepaired_drops
from jobs.streaming.outage import Answer, OutageClock, stop_signals, wait_for_brokers
from jobs.streaming.seed import seed_stream
from jobs.streaming.spark import state_stores_for
from jobs.superseded import remove_superseded_dead_letters
from jobs.warehouse import Location


@dataclass
class RunSummary:
    application_id: str
    epoch: int
    batches: list[BatchResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def records_in(self) -> int:
        return sum(int(b.ledger.get("records_in", 0)) for b in self.batches if not b.skipped)


log = logging.getLogger(__name__)
POLL_S = 0.2
FENCE_CHECK_S = 5.0
# A seeded epoch's checkpoint once its seed batches are committed (absorb_seed).
SEEDED_MARK = "_platform_seeded"
# How long the seed query stays idle before it counts as done without a no-data batch.
SEED_SETTLE_S = 2.0


def epoch_cut(layout: AppLayout, pipeline: Pipeline, settings: Settings) -> Cut:
    """The cut the current epoch starts from, fixed once so every restart agrees.

    For a new application it comes from the pipeline's ``starting_offsets``
    resolved against the broker now; maintenance operations write their own.
    """
    epoch = current_epoch(layout)
    cut = read_cut(layout, epoch)
    if cut is not None:
        return cut
    if epoch > 0:
        raise ConsistencyError(
            f"epoch {epoch} of {layout.application_id} has no cut: an operation fenced the "
            "application and did not finish; run the operation again (see the ledger)"
        )
    config = kafka_admin.client_config(settings.bootstrap_servers, settings.kafka_client)
    partitions = kafka_admin.topic_partitions(
        kafka_admin.admin(config), pipeline.topics, settings.bootstrap_servers
    )
    marks = kafka_admin.watermarks(
        config, [(t, p) for t, parts in partitions.items() for p in parts]
    )
    start = plan.resolve_starting_offsets(pipeline.starting_offsets, partitions, marks)
    cut = Cut(
        epoch=epoch,
        starting_offsets=plan.to_json_dict(start),
        origin=Origin.PIPELINE.value,
        topic_ids=kafka_admin.topic_ids(kafka_admin.admin(config), pipeline.topics),
        state_shape=pipeline.state_shape,
        definition=recorded_definition(pipeline),
    )
    write_cut(layout, cut)
    return cut


def preflight(pipeline: Pipeline, settings: Settings) -> None:
    """Checks that need no Spark, made before it starts (seconds saved, and no
    half-started run): the pipeline's state shape against the current epoch's.
    ``_run_locked`` checks again under the lock."""
    layout = AppLayout(settings.warehouse, pipeline.application_id)
    if not layout.table(tables.LEDGER).exists():
        return
    cut = latest_cut(layout, current_epoch(layout))
    if cut is not None:
        check_state_shape(layout, pipeline, cut)
        check_definition(layout, pipeline, cut)


def broker_watermarks(pipeline: Pipeline, settings: Settings) -> plan.Watermarks:
    config = kafka_admin.client_config(settings.bootstrap_servers, settings.kafka_client)
    partitions = kafka_admin.topic_partitions(
        kafka_admin.admin(config), pipeline.topics, settings.bootstrap_servers
    )
    return kafka_admin.watermarks(config, [(t, p) for t, ps in partitions.items() for p in ps])


def absorb_seed(writer: DataStreamWriter, checkpoint: Location, windowed: bool) -> None:
    """The seeded epoch's first query: the seed batch (and, windowed, the no-data
    batch in which Spark moves the watermark on from the seeded windows, the one
    its records must be judged by) with Kafka held at the cut. A mark in the
    checkpoint says it is done: the next query of the checkpoint reads Kafka from
    the cut (the hold stood in its place with the same offsets)."""
    running = writer.trigger(processingTime="200 milliseconds").start()
    try:
        settled_since: float | None = None
        while running.isActive:
            done = offset_log.committed_batches(checkpoint)
            if done and done[-1] >= (1 if windowed else 0):
                break
            # The watermark did not move (no seeded window): no no-data batch follows.
            idle = bool(done) and offset_log.offset_batches(checkpoint)[-1] == done[-1]
            settled_since = (settled_since or time.monotonic()) if idle else None
            if settled_since is not None and time.monotonic() - settled_since > SEED_SETTLE_S:
                break
            time.sleep(0.1)
        if running.exception() is not None:
            raise ConsistencyError(f"seeding the epoch's state failed: {running.exception()}")
    finally:
        running.stop()
    (checkpoint / SEEDED_MARK).write_bytes(b"")
    log.info("seed absorbed in %s; Kafka resumes from the cut", checkpoint)


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
    resolved = records.resolve(spark, pipeline, settings.warehouse)
    layout = AppLayout(settings.warehouse, pipeline.application_id)
    with stop_signals() as stop:
        return _run_until_stopped(RunContext(spark, resolved, settings, layout, trigger, stop))


@dataclass(frozen=True)
class RunContext:
    """What every attempt of one run shares: the session, the resolved pipeline, the
    settings, where the application lives, the trigger asked for, and the stop event
    (SIGTERM/SIGINT, ``outage.stop_signals``)."""

    spark: SparkSession
    resolved: Resolved
    settings: Settings
    layout: AppLayout
    trigger: str | None
    stop: threading.Event


def _run_until_stopped(run: RunContext) -> RunSummary:
    settings, layout, stop, trigger = run.settings, run.layout, run.stop, run.trigger
    pipeline = run.resolved.pipeline
    mode = trigger or pipeline.trigger_mode
    clock = OutageClock(settings.outage_wait_s if mode != "available-now" else 0)
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
            config = kafka_admin.client_config(settings.bootstrap_servers, settings.kafka_client)
            waited_in = _committed(layout)[0]  # the epoch the failed attempt ran in
            answer = wait_for_brokers(config, pipeline.topics, deadline, stop)
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
        with application_lock(
            layout, f"run --trigger {run.trigger or pipeline.trigger_mode}"
        ) as held:
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
    started = time.monotonic()
    resolved, settings, layout = run.resolved, run.settings, run.layout
    pipeline = resolved.pipeline
    tables.ensure_tables(layout, resolved)
    store(layout, resolved)  # for the tools that run without Spark
    unfinished = unfinished_operation(layout)
    if unfinished is not None:
        raise ConsistencyError(
            f"{pipeline.application_id}: {unfinished.describe()}; run the same "
            f"{unfinished.operation} again to complete it (python -m jobs {unfinished.operation} "
            f"--pipeline {pipeline.application_id} ...), then run"
        )
    refuse_unrepaired_drops(layout)
    remove_superseded_dead_letters(layout)  # what a repair judges again, if not yet
    epoch = current_epoch(layout)
    cut = epoch_cut(layout, pipeline, settings)
    check_state_shape(layout, pipeline, cut)
    check_definition(layout, pipeline, cut)
    config = kafka_admin.client_config(settings.bootstrap_servers, settings.kafka_client)
    # Opening the publisher fences an older one; what an operation or a crash left
    # unpublished goes out before the first batch.
    output = open_publisher(resolved, layout, config)
    try:
        if output is not None:
            output.publish_pending()
        return _stream(run, epoch, cut, output, started, held)
    finally:
        if output is not None:
            output.close()


def _stream(
    run: RunContext,
    epoch: int,
    cut: Cut,
    output: OutputPublisher | None,
    started: float,
    held: Holding,
) -> RunSummary:
    spark, resolved, settings, layout = run.spark, run.resolved, run.settings, run.layout
    trigger, stop = run.trigger, run.stop
    pipeline = resolved.pipeline
    config = kafka_admin.client_config(settings.bootstrap_servers, settings.kafka_client)
    kafka_admin.check_same_topics(
        cut.topic_ids, kafka_admin.topic_ids(kafka_admin.admin(config), pipeline.topics)
    )
    checkpoint = layout.checkpoint(epoch)
    # Only used while the epoch's checkpoint has no batch yet (Spark ignores it after).
    first_batch = not offset_log.offset_batches(checkpoint)
    marks = broker_watermarks(pipeline, settings)
    starting = plan.to_json_dict(start_of(cut, marks, first_batch))
    seed_path = seed_file(layout, epoch) if cut.seed_rows is not None else None
    name = f"{pipeline.application_id}_epoch{epoch}"
    spark.conf.set("spark.sql.shuffle.partitions", str(pipeline.shuffle_partitions))
    replays = dimensions.replay_ranges(spark, resolved, layout, cut.offsets())

    def stream(hold: bool) -> DataFrame:
        seed = seed_stream(spark, resolved, seed_path) if seed_path is not None else None
        return query.build(
            spark,
            resolved,
            settings.bootstrap_servers,
            json.dumps(starting),
            settings.kafka_client,
            checkpoint.spark_uri,
            seed=seed,
            hold=hold,
            min_watermark_ms=cut.watermark_ms,
            replays=replays,
        )

    consumer_config = kafka_admin.client_config(settings.bootstrap_servers, settings.kafka_client)
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
    )
    METRICS.watch_lag(
        pipeline.application_id,
        pipeline.version,
        lambda: kafka_admin.consumer_lag(consumer_config, committer.positions),
    )
    log.info(
        "%s: epoch %d starts from the %s cut (seeded rows: %s, watermark floor %d ms)",
        pipeline.application_id,
        epoch,
        cut.origin,
        cut.seed_rows,
        cut.watermark_ms,
    )

    def writer(hold: bool) -> DataStreamWriter:
        return (
            stream(hold)
            .writeStream.queryName(name)
            .outputMode("update")
            .foreachBatch(committer)
            .option("checkpointLocation", checkpoint.spark_uri)
        )

    if seed_path is not None and not (checkpoint / SEEDED_MARK).exists():
        state_stores_for(spark, short=True)
        absorb_seed(writer(hold=True), checkpoint, pipeline.window is not None)
    mode = trigger or pipeline.trigger_mode
    state_stores_for(spark, short=mode == "available-now")
    if mode == "available-now":
        running = writer(hold=False).trigger(availableNow=True).start()
    else:
        interval = f"{pipeline.trigger_interval_seconds} seconds"
        running = writer(hold=False).trigger(processingTime=interval).start()
    # An available-now run (a replay after a rewind or rebuild, say) shows how far
    # it is through what was there when it started.
    head = {tp: high for tp, (_low, high) in marks.items()}
    first = plan.from_json_dict(starting)
    total = sum(max(0, end - first.get(tp, end)) for tp, end in head.items())
    progress = (
        Progress(f"{pipeline.application_id} epoch {epoch}", total)
        if (mode == "available-now" and total)
        else None
    )

    def report() -> None:
        if progress is not None:
            reached = plan.from_json_dict(committer.positions)
            progress.update(
                sum(
                    max(0, min(reached.get(tp, 0), end) - first.get(tp, end))
                    for tp, end in head.items()
                )
            )

    if progress is not None:
        progress.__enter__()
    finished = False
    try:
        _await_query(running, committer, layout, epoch, stop, report)
        finished = True
    finally:
        committer.close()
        if progress is not None:  # an unfinished run's bar is not filled up
            progress.__exit__(None if finished else RuntimeError, None, None)
    return RunSummary(pipeline.application_id, epoch, committer.results, time.monotonic() - started)


def _await_query(
    running: StreamingQuery,
    committer: BatchCommitter,
    layout: AppLayout,
    epoch: int,
    stop: threading.Event,
    report: Callable[[], None],
) -> None:
    """Wait for the query to end: its input done (available-now), ``stop`` set, or
    an operation that moved the application on (a fence). Spark's drops of late
    records are checked for every batch it ran, also when the query failed: the
    restart's new query has no progress of them."""
    finished = False
    try:
        checked = time.monotonic()
        # A short wait: a scheduled run exits as soon as its last batch is in
        # (PySpark takes float seconds, though typed int).
        while not running.awaitTermination(POLL_S):  # type: ignore[arg-type]
            report()
            if stop.is_set():
                running.stop()
            elif time.monotonic() - checked > FENCE_CHECK_S:
                checked = time.monotonic()
                if current_epoch(layout) > epoch:  # an idle stream would never commit
                    running.stop()
                    raise FencedError(
                        f"{layout.application_id} moved to epoch {current_epoch(layout)}; "
                        f"this run of epoch {epoch} stopped without committing anything more"
                    )
        running.awaitTermination()
        report()
        finished = True
    finally:
        if finished:
            committer.check_watermark_drops(running.recentProgress)
        else:
            _check_drops_of_a_failed_query(running, committer)


def _check_drops_of_a_failed_query(running: StreamingQuery, committer: BatchCommitter) -> None:
    """A drop found stops the run (``ConsistencyError``, recorded first) in place of
    the failure on its way; a check that cannot be made leaves that failure as it is
    (an outage or a fence must reach the run's loop as what it is)."""
    try:
        committer.check_watermark_drops(running.recentProgress)
    except ConsistencyError:
        raise
    except Exception as exc:
        log.warning("could not check the failed query's batches for late drops: %s", exc)
