"""The per-micro-batch commit (``foreachBatch``): Spark's output -> Delta tables.

For batch ``b`` of epoch ``e``, in this order, each commit idempotent and fenced
(see ``jobs/delta/writer.py``):

1. ``dead_letter``: records that could not be aggregated, with the reason;
2. ``raw`` (archive pipelines): the batch's records as read;
3. ``changelog``: every (key, window) whose aggregate changed, with its new value;
4. ``state``: the same rows merged in (current value per key and window);
5. ``_ledger``: one row: offsets, counts, versions. It is written last and marks
   the batch committed;
6. the output topic, if the pipeline has one: the state versions not yet in it,
   each in one Kafka transaction (``jobs/output/publisher.py``).

The driver holds no batch's rows: Spark's tasks write the data files of ``raw``
(the batch's offset range read again) and of ``changelog`` (``changelog_files.py``, per
output partition) and the driver commits them (``jobs/delta/files.py``); the state
merge streams the changelog files; dead letters, rare by nature, are read back
from Kafka by position in bounded batches (``dead_letters.py``).

A crash anywhere before Spark's own batch commit replays the batch with the same
offsets (Spark's offset log) and the same epoch; tables that already have the
batch skip it. Counts are checked before anything is written:
``records_in = records_valid + filtered + dead_lettered``, no more records than offsets, one
dead letter per dead-lettered record. The rows written are Spark's update-mode
output as it is (no re-read of the state table: the cost of a batch does not grow
with the state); Spark's own late-row drops, which must stay zero because late
records are dead letters first, are checked from its progress. A drop is recorded
in the ledger, and ``run`` refuses until a repair took the state from before it.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession

from jobs import kafka_admin
from jobs.audit import append_audit, audit_row
from jobs.cut import recorded_definition
from jobs.delta import layout as tables
from jobs.delta.files import DataFile
from jobs.delta.layout import AppLayout
from jobs.delta.writer import BatchWriter, committed_batch, window_range
from jobs.errors import ConsistencyError
from jobs.faults import maybe_crash
from jobs.kafka_source import offsets as kafka_offsets
from jobs.kafka_source import spark_kafka
from jobs.kafka_source.offsets import Offsets, Watermarks, from_json_dict
from jobs.ledger import current_ledger
from jobs.lineage import History, Pin
from jobs.metrics import METRICS, Metrics
from jobs.monitoring_group import MonitoringGroup
from jobs.output.publisher import OutputPublisher
from jobs.progress import Progress
from jobs.resolution import Resolved
from jobs.streaming import enrichment, offset_log, table_versions
from jobs.streaming.changelog_files import WRITTEN_SCHEMA, StagedFilesTask
from jobs.streaming.dead_letters import batch_reader
from jobs.streaming.judging import OBSERVATION
from jobs.streaming.observed import observed_metrics, watermark_reached
from jobs.streaming.seed import verify_seeded_state
from jobs.streaming.summary import BatchResult
from jobs.warehouse import Location, parquet_dataset, parquet_rows

log = logging.getLogger(__name__)
# Changed rows a batch's state merge takes in memory (see ChangedRows.source).
MERGE_IN_MEMORY_ROWS = 1_000_000
# The ledger row recording that Spark dropped late rows in a committed batch.
WATERMARK_DROP = "watermark_drop"


class ChangedRows:
    """The rows a batch changed, as the state merge's source: streamed from the
    changelog's files (the tasks' new ones, or on a replay the committed table
    filtered to the batch), never held whole by the driver."""

    def __init__(
        self,
        changelog: Location,
        state_schema: pa.Schema,
        files: list[DataFile] | None = None,
        where: ds.Expression | None = None,
    ) -> None:
        self.changelog = changelog
        self.state_schema = state_schema
        self.files = files
        self.where = where
        if files is None:
            self.num_rows = DeltaTable(str(changelog)).to_pyarrow_dataset().count_rows(filter=where)
        else:
            self.num_rows = sum(f.num_records for f in files)

    def source(self) -> pa.Table | pa.RecordBatchReader:
        """The merge's source, once the files are committed (read from the table's
        folder). Up to ``MERGE_IN_MEMORY_ROWS`` rows it is a table: delta-rs then
        prunes the state files the keys' range cannot touch (a streamed source
        cost twice as long at 2M state rows); beyond, a stream (bounded memory)."""
        reader = self._reader()
        return reader.read_all() if self.num_rows <= MERGE_IN_MEMORY_ROWS else reader

    def within(self) -> str | None:
        """The merge's condition on the state rows it can touch: a windowed state's
        rows between the oldest and newest window the batch changed (one column
        read from the changelog files)."""
        if "window_start" not in self.state_schema.names:
            return None
        column = self._dataset().to_table(columns=["window_start"], filter=self.where)
        return window_range("window_start", column["window_start"])

    def _dataset(self) -> ds.Dataset:
        if self.files is None:
            return DeltaTable(str(self.changelog)).to_pyarrow_dataset()
        return parquet_dataset([self.changelog / f.name for f in self.files])

    def _reader(self) -> pa.RecordBatchReader:
        # The changelog's columns, with commit_time as the state's updated_at.
        names = [*self.state_schema.names[:-1], "commit_time"]
        batches = self._dataset().to_batches(columns=names, filter=self.where)
        return pa.RecordBatchReader.from_batches(
            self.state_schema,
            (pa.RecordBatch.from_arrays(b.columns, schema=self.state_schema) for b in batches),
        )


@dataclass(frozen=True)
class Reach:
    """How far an available-now run (a replay after a rewind or rebuild, say) is
    through what its topics held when it started: from ``start`` to each
    partition's high watermark in ``marks``."""

    title: str
    start: Offsets
    marks: Watermarks

    def total(self) -> int:
        return sum(
            max(0, high - self.start.get(tp, high)) for tp, (_low, high) in self.marks.items()
        )

    def done(self, positions: dict[str, Any]) -> int:
        reached = from_json_dict(positions)
        return sum(
            max(0, min(reached.get(tp, 0), high) - self.start.get(tp, high))
            for tp, (_low, high) in self.marks.items()
        )


class _Laps:
    """A batch's timings: each phase's seconds since the previous lap."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.timings: dict[str, float] = {}

    def lap(self, name: str) -> None:
        self.timings[name] = round(self.elapsed() - sum(self.timings.values()), 3)

    def elapsed(self) -> float:
        return time.monotonic() - self.started


class BatchCommitter:
    """Callable for ``foreachBatch``; one instance per streaming run."""

    def __init__(
        self,
        spark: SparkSession,
        resolved: Resolved,
        layout: AppLayout,
        epoch: int,
        checkpoint: Location,
        initial_offsets: dict[str, Any],
        query_name: str,
        bootstrap_servers: str,
        kafka_client: dict[str, str],
        seed_path: Location | None = None,
        watermark_floor_ms: int = 0,
        metrics: Metrics = METRICS,
        replays: list[tuple[Any, ...]] | None = None,
        output: OutputPublisher | None = None,
        guard: Callable[[], None] | None = None,
        reach: Reach | None = None,
    ) -> None:
        self.spark = spark
        self.output = output
        self.metrics = metrics
        self.resolved = resolved
        self.pipeline = pipeline = resolved.pipeline
        self.layout = layout
        self.epoch = epoch
        self.checkpoint = checkpoint
        self.initial_offsets = initial_offsets
        # Next offset per topic-partition after the last commit (the lag metric's):
        # a restarted run starts from its checkpoint's last committed batch.
        done = offset_log.committed_batches(checkpoint)
        self.positions: dict[str, Any] = (
            offset_log.read_offsets(checkpoint, done[-1]).end_offsets if done else initial_offsets
        )
        self.query_name = query_name
        self.writer = BatchWriter(
            pipeline.application_id, epoch, pipeline.exactly_once, guard=guard
        )
        # The ledger is the platform's record: one row per batch under either
        # guarantee, so it always carries the batch marker.
        self.ledger_writer = BatchWriter(
            pipeline.application_id, epoch, exactly_once=True, guard=guard
        )
        self.bootstrap_servers = bootstrap_servers
        self.kafka_client = kafka_client
        self.consumer_config = kafka_admin.client_config(bootstrap_servers, kafka_client)
        self.monitoring = MonitoringGroup(self.consumer_config, pipeline.application_id)
        self.results: list[BatchResult] = []
        self.aggregate_schema = resolved.aggregate_schema
        self.changelog_schema = resolved.changelog_schema
        self.state_schema = resolved.state_schema
        self.seed_path = seed_path
        # The source judges lateness by max(Spark's watermark, the cut's floor); the
        # ledger records that one, so backfills and later cuts decide the same way.
        self.watermark_floor_ms = watermark_floor_ms
        # Ranges earlier batches judged that this run may replay (``table_versions.merged``).
        self.replays = replays or []
        self._changed_rows = 0
        self._checked_progress: set[int] = set()
        # (batch id, the watermark Spark moves on to after it): checked against the
        # next batch's offset log entry, or at the end against the commit log.
        self._reached: tuple[int, int] | None = None
        # An available-now run shows how far it is through what was there at its start.
        self.reach = reach
        total = 0 if reach is None else reach.total()
        self.progress = Progress(reach.title, total) if reach is not None and total else None
        if self.progress is not None:
            self.progress.__enter__()

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        """One micro-batch: read (the one Spark action), then commit: dead letters,
        raw archive, changelog, state, and last the ledger row that makes it done."""
        laps = _Laps(time.monotonic())
        self.check_watermark_drops()  # of the batches committed before this one
        extra = self._seed_check(batch_id)
        now = pa.scalar(int(time.time() * 1_000_000), tables.TIMESTAMP)
        ledger_path = self.layout.table(tables.LEDGER)
        done = committed_batch(
            DeltaTable(str(ledger_path)), self.pipeline.application_id, self.epoch
        )
        skipped = done is not None and done >= batch_id
        changelog_path = self.layout.table("changelog")
        changelog_done = self._committed(changelog_path, batch_id)
        seed_batch = batch_id == 0 and self.seed_path is not None
        written = self._scan(batch, batch_id, now, not (seed_batch or changelog_done or skipped))
        laps.lap("spark")
        if seed_batch and self.seed_path is not None:
            extra["seed_rows"] = parquet_rows(self.seed_path)
        metrics = observed_metrics(self.spark, self.query_name, OBSERVATION)
        offsets = offset_log.read_offsets(self.checkpoint, batch_id)
        self._check_reached(batch_id, offsets.watermark_ms)
        reached = offsets.watermark_ms
        if self.pipeline.window is not None:
            reached = watermark_reached(self.spark, self.query_name, offsets.watermark_ms)
        self._reached = (batch_id, reached)
        if skipped:
            self._skip(batch_id, offsets.end_offsets)
            return
        start = offset_log.batch_start(
            self.initial_offsets
            if batch_id == 0
            else offset_log.read_offsets(self.checkpoint, batch_id - 1).end_offsets,
            offsets.end_offsets,
        )
        # A replay whose changelog commit happened before the crash: its rows are
        # the committed ones (the state still needs them).
        changes = (
            self._committed_changes(changelog_path, batch_id)
            if changelog_done
            else ChangedRows(changelog_path, self.state_schema, written)
        )
        self._changed_rows = changes.num_rows
        counts = self._counts(metrics, batch_id, start, offsets.end_offsets)
        stamp = {"epoch": self.epoch, "batch_id": batch_id, "commit_time": now.as_py()}
        meta = {"platform_operation": "batch", "pipeline_version": str(self.pipeline.version)}
        laps.lap("prepare")
        versions = self._commit_tables(
            batch_id, (start, offsets.end_offsets), changes, written, metrics, stamp, meta, laps
        )
        ledger = self._ledger_row(batch_id, start, offsets, counts, versions, now)
        ledger["details"] = json.dumps(
            {
                # "now" of the batch's event-time bounds (a backfill reuses it)
                "batch_timestamp_ms": offsets.batch_timestamp_ms,
                # The watermark it leaves: what a cut after it starts from.
                "next_watermark_ms": max(reached, self.watermark_floor_ms),
                "definition": recorded_definition(self.pipeline),
                **self._dimension_versions(metrics, start, offsets.end_offsets),
                "seconds": round(laps.elapsed(), 3),
                "timings": laps.timings,
                **extra,
            }
        )
        self.ledger_writer.append(
            ledger_path, batch_id, pa.Table.from_pylist([ledger], tables.LEDGER_SCHEMA), meta
        )
        maybe_crash("after_ledger", batch_id)
        self._after_commit(batch_id, offsets.end_offsets, ledger, metrics, laps)

    def _seed_check(self, batch_id: int) -> dict[str, Any]:
        """Batch 0 absorbed the seed and read no record (Kafka waited for its
        commit); before batch 1's records are aggregated, Spark's state must equal
        the cut's snapshot. A mismatch stops here, nothing committed."""
        if batch_id != 1 or self.seed_path is None:
            return {}
        rows = verify_seeded_state(self.spark, self.resolved, self.checkpoint, self.seed_path)
        return {"seed_verified_rows": rows}

    def _scan(self, batch: DataFrame, batch_id: int, now: Any, write: bool) -> list[DataFile]:
        """The one action on this batch: it runs the scan, the aggregation, the
        observation and the tasks' changelog files together (a second action would
        scan Kafka again). Spark's update-mode output is exactly the (key, window)
        rows this batch changed; the seed batch re-emits the cut's snapshot, which
        the state table already holds (``write`` false: nothing staged)."""
        task = StagedFilesTask(
            str(self.layout.table("changelog")),
            self.epoch,
            batch_id,
            self.aggregate_schema,
            self.changelog_schema,
            (("epoch", self.epoch), ("batch_id", batch_id), ("commit_time", now.value)),
            write=write,
        )
        return [
            DataFile(row["name"], row["size"], row["num_records"])
            for row in batch.mapInArrow(task, WRITTEN_SCHEMA).collect()
        ]

    def _check_reached(self, batch_id: int, watermark_ms: int) -> None:
        """The watermark Spark runs a batch with is the one recorded as reached by
        the batch before it (``watermark_reached``, in the same query), or by a
        query's last batch in Spark's commit log."""
        if self._reached is None or self._reached[0] != batch_id - 1:
            return
        if self._reached[1] != watermark_ms:
            raise ConsistencyError(
                f"{self.pipeline.application_id}: batch {self._reached[0]} of epoch "
                f"{self.epoch} recorded {self._reached[1]} ms as the watermark it leaves, "
                f"but Spark runs batch {batch_id} with {watermark_ms} ms; run again to go "
                f"on with Spark's (a repair from batch {self._reached[0]} starts from the "
                "recorded one)"
            )

    def _skip(self, batch_id: int, end: dict[str, Any]) -> None:
        """A batch the ledger already holds (a replay after a crash past its commit)."""
        log.info("batch %d of epoch %d is already committed: skipped", batch_id, self.epoch)
        self._moved(end)
        self.metrics.replay_skipped(self.pipeline.application_id, self.pipeline.version)
        self.results.append(BatchResult(batch_id, True, {}))
        self._publish()

    def _commit_tables(
        self,
        batch_id: int,
        span: tuple[dict[str, Any], dict[str, Any]],
        changes: ChangedRows,
        written: list[DataFile],
        metrics: dict[str, Any],
        stamp: dict[str, Any],
        meta: dict[str, str],
        laps: _Laps,
    ) -> dict[str, int | None]:
        """The batch's tables, each commit idempotent by (epoch, batch): dead
        letters, the raw archive, the changelog, then the state merge. Returns the
        Delta versions written, and the state version the batch leaves behind."""
        versions: dict[str, int | None] = {}
        letters = metrics["dead_letters"]
        if letters:
            versions["dead_letter"] = self.writer.append(
                self.layout.table("dead_letter"),
                batch_id,
                batch_reader(self.consumer_config, letters, stamp),
                meta,
            )
        laps.lap("dead_letter")
        maybe_crash("after_dead_letter", batch_id)
        if self.pipeline.archive:
            versions["raw"] = self._archive(batch_id, *span, meta)
            laps.lap("raw")
        if changes.num_rows:
            if written:
                versions["changelog"] = self.writer.add_files(
                    self.layout.table("changelog"), batch_id, written, self.changelog_schema, meta
                )
            laps.lap("changelog")
            maybe_crash("after_changelog", batch_id)
            versions["state"] = self.writer.merge(
                self.layout.table("state"),
                batch_id,
                changes.source,
                self.pipeline.state_keys,
                meta,
                within=changes.within(),
            )
            laps.lap("state")
            maybe_crash("after_state", batch_id)
        # The state version this batch leaves behind: a rewind's time-travel target.
        versions["state_after"] = (
            versions.get("state") or DeltaTable(str(self.layout.table("state"))).version()
        )
        return versions

    def _ledger_row(
        self,
        batch_id: int,
        start: dict[str, Any],
        offsets: Any,
        counts: dict[str, int],
        versions: dict[str, int | None],
        now: Any,
    ) -> dict[str, Any]:
        """The batch's ledger row, but its ``details``."""
        return {
            "application_id": self.pipeline.application_id,
            "entry_type": "batch",
            "epoch": self.epoch,
            "batch_id": batch_id,
            "start_offsets": json.dumps(start, sort_keys=True),
            "end_offsets": json.dumps(offsets.end_offsets, sort_keys=True),
            **counts,
            "watermark_ms": max(offsets.watermark_ms, self.watermark_floor_ms),
            "pipeline_version": self.pipeline.version,
            "processing_guarantee": self.pipeline.processing_guarantee,
            "delta_versions": json.dumps(versions, sort_keys=True),
            "details": None,
            "commit_time": now.as_py(),
        }

    def _after_commit(
        self,
        batch_id: int,
        end: dict[str, Any],
        ledger: dict[str, Any],
        metrics: dict[str, Any],
        laps: _Laps,
    ) -> None:
        """The batch is committed: its state version goes out, its offsets reach the
        lag metric and Kafka's lag tools, its counts the metrics and the log."""
        self._publish()
        self._moved(end)
        self.monitoring.commit(self.positions)  # Kafka's lag tools (never waits)
        self.metrics.batch_committed(
            self.pipeline.application_id,
            self.pipeline.version,
            ledger,
            [letter["reason"] for letter in metrics["dead_letters"]],
            metrics.get("oldest_record_us"),
            laps.elapsed(),
        )  # never raises: the batch is committed already
        log.info(
            "%s epoch %d batch %d committed: %d in, %d aggregated, %d dead-lettered, "
            "%d state rows changed, %.2f s",
            self.pipeline.application_id,
            self.epoch,
            batch_id,
            ledger["records_in"],
            ledger["aggregated"],
            ledger["dead_lettered"],
            ledger["state_rows_changed"],
            laps.elapsed(),
        )
        self.results.append(BatchResult(batch_id, False, ledger))

    def close(self, finished: bool = True) -> None:
        """At the run's end: the last batch's offsets reach the monitoring group; the
        progress bar ends (an unfinished run's is not filled up); the watermark the
        last batch recorded is the one Spark committed."""
        self.monitoring.close()
        if self.progress is not None:
            self.progress.__exit__(None if finished else RuntimeError, None, None)
        if finished and self._reached is not None:
            last = self._reached[0]
            if last in offset_log.committed_batches(self.checkpoint):
                self._check_reached(last + 1, offset_log.next_watermark(self.checkpoint, last))

    def _moved(self, end: dict[str, Any]) -> None:
        self.positions = end
        if self.progress is not None and self.reach is not None:
            self.progress.update(self.reach.done(end))

    def _publish(self) -> None:
        """The state versions not yet in the output topic (this batch's, and any a
        crash left behind), each in one Kafka transaction. A failure fails the
        batch in Spark: the replay skips the committed tables and publishes again."""
        if self.output is not None:
            self.output.publish_pending()

    def _committed(self, path: Location, batch_id: int) -> bool:
        if not self.pipeline.exactly_once:
            return False
        done = committed_batch(DeltaTable(str(path)), self.pipeline.application_id, self.epoch)
        return done is not None and done >= batch_id

    def _committed_changes(self, changelog: Location, batch_id: int) -> ChangedRows:
        where = (ds.field("epoch") == self.epoch) & (ds.field("batch_id") == batch_id)
        return ChangedRows(changelog, self.state_schema, where=where)

    def _archive(
        self,
        batch_id: int,
        start: dict[str, Any],
        end: dict[str, Any],
        meta: dict[str, str],
    ) -> int | None:
        """The batch's records, read again from Kafka by exactly its offset range,
        appended to ``raw`` once (Spark's tasks write the files, the driver commits)."""
        path = self.layout.table("raw")
        if self._committed(path, batch_id):
            return None
        ends = kafka_offsets.from_json_dict(end)
        starts = kafka_offsets.from_json_dict(start)
        if not any(ends[tp] > starts.get(tp, ends[tp]) for tp in ends):
            return None
        records = spark_kafka.read_range(
            self.spark, self.bootstrap_servers, self.kafka_client, starts, ends
        )
        kafka_columns = pa.schema(list(tables.RAW_SCHEMA)[:-2])
        task = StagedFilesTask(
            str(path),
            self.epoch,
            batch_id,
            kafka_columns,
            tables.RAW_SCHEMA,
            (("epoch", self.epoch), ("batch_id", batch_id)),
            write=True,
        )
        written = [
            DataFile(row["name"], row["size"], row["num_records"])
            for row in records.select(*kafka_columns.names)
            .mapInArrow(task, WRITTEN_SCHEMA)
            .collect()
        ]
        written = [f for f in written if f.num_records]
        if not written:
            return None
        return self.writer.add_files(path, batch_id, written, tables.RAW_SCHEMA, meta)

    def _dimension_versions(
        self, metrics: dict[str, Any], start: dict[str, Any], end: dict[str, Any]
    ) -> dict[str, Any]:
        """The table each enrichment's join read (version, table id and location, as
        the source reported them; None: the batch had no record to join), and the
        ranges it replayed with the tables their earlier judgment recorded, as the
        ledger records them."""
        if not self.pipeline.enrich:
            return {}
        found: dict[str, Any] = {"dimensions": {}}
        for i, e in enumerate(self.pipeline.enrich):
            version = metrics.get(enrichment.version_column(i))
            found["dimensions"][e.name] = (
                None
                if version is None
                else Pin(
                    int(version),
                    str(metrics.get(enrichment.table_column(i)) or ""),
                    self.resolved.dimensions[e.name].path,
                ).to_json()
            )
        replayed = table_versions.pieces(
            self.replays,
            [e.name for e in self.pipeline.enrich],
            kafka_offsets.from_json_dict(start),
            kafka_offsets.from_json_dict(end),
        )
        if replayed:
            found["replayed"] = [
                [*piece[:4], {n: pin.to_json() for n, pin in piece[4].items()}]
                for piece in replayed
            ]
        return found

    def _counts(
        self,
        metrics: dict[str, Any],
        batch_id: int,
        start: dict[str, Any],
        end: dict[str, Any],
    ) -> dict[str, int]:
        records_in = int(metrics["records_in"])
        valid = int(metrics["records_valid"])
        filtered = int(metrics["filtered"])
        dead = int(metrics["dead_lettered"])
        per_record = self.pipeline.window.windows_per_record if self.pipeline.window else 1
        # Late records are dead letters before the aggregation (judged with the
        # watermark Spark uses for this batch), so every valid record's windows are
        # aggregated; Spark's own watermark drops are checked from its progress
        # (``check_watermark_drops``), which must stay zero.
        aggregated = valid * per_record
        late = 0
        offsets_span = sum(
            off - start.get(topic, {}).get(part, off)
            for topic, parts in end.items()
            for part, off in parts.items()
        )
        problems = []
        if records_in != valid + filtered + dead:
            problems.append(
                f"records_in {records_in} != aggregated {valid} + filtered {filtered} + "
                f"dead-lettered {dead}"
            )
        if len(metrics["dead_letters"]) != dead:
            problems.append(
                f"{len(metrics['dead_letters'])} dead letters collected, {dead} counted"
            )
        if records_in > offsets_span:
            problems.append(f"{records_in} records read from an offset span of {offsets_span}")
        if problems:
            raise ConsistencyError(f"batch {batch_id} does not add up: " + "; ".join(problems))
        return {
            "records_in": records_in,
            "records_valid": valid,
            "filtered": filtered,
            "dead_lettered": dead,
            "aggregated": aggregated,
            "late_dropped": late,
            "windows_per_record": per_record,
            "state_rows_changed": self._changed_rows,
        }

    def check_watermark_drops(self, progress: list[Any] | None = None) -> None:
        """Spark must never drop a record as late: the source routes late records to
        the dead letters with the same watermark first. A drop means the state misses
        records the ledger counted: stop, naming the batch and the repair."""
        if progress is None:
            running = [q for q in self.spark.streams.active if q.name == self.query_name]
            progress = running[0].recentProgress if running else []
        for item in progress:
            entry = json.loads(item.json) if hasattr(item, "json") else dict(item)
            batch_id = int(entry.get("batchId", -1))
            if batch_id in self._checked_progress:
                continue
            self._checked_progress.add(batch_id)
            dropped = sum(
                int(op.get("numRowsDroppedByWatermark", 0) or 0)
                for op in entry.get("stateOperators", [])
            )
            if dropped:
                # Recorded before it stops the run: the next run (an Airflow retry is
                # a new process, which never sees this progress) refuses too.
                details = {"batch_id": batch_id, "dropped": dropped}
                append_audit(
                    self.layout, audit_row(self.pipeline, WATERMARK_DROP, self.epoch, details)
                )
                raise drop_error(self.pipeline.application_id, self.epoch, details)


def drop_error(application_id: str, epoch: int, drop: dict[str, Any]) -> ConsistencyError:
    return ConsistencyError(
        f"Spark dropped {drop['dropped']} late row(s) in batch {drop['batch_id']} of epoch "
        f"{epoch} of {application_id} that were counted as aggregated; the state misses them, "
        f"and run refuses until it is repaired: python -m jobs backfill --pipeline "
        f"{application_id} --from-earliest --reason ..."
    )


def unrepaired_drops(recorded: list[dict[str, Any]], history: History) -> list[dict[str, Any]]:
    """The recorded drops (``WATERMARK_DROP`` rows) whose batch the state is still
    made of: no operation since took the state from before it (a backfill from an
    earlier start, a rewind to before it, a rebuild from the source)."""
    drops = [{**json.loads(r["details"] or "{}"), "epoch": int(r["epoch"])} for r in recorded]
    return [d for d in drops if history.holds(d["epoch"], int(d["batch_id"]))]


def refuse_unrepaired_drops(layout: AppLayout) -> None:
    """``run`` refuses while a recorded drop stands: its batches would bury the
    batch whose state misses the dropped rows."""
    ledger_now = current_ledger(layout)
    if ledger_now is None:
        return
    where = ds.field("entry_type") == WATERMARK_DROP
    recorded = ledger_now.rows(["epoch", "details"], where).to_pylist()
    standing = unrepaired_drops(recorded, ledger_now.history()) if recorded else []
    if standing:
        raise drop_error(layout.application_id, standing[0]["epoch"], standing[0])
