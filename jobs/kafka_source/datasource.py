"""The ``kafka_py`` streaming data source for Spark 4, built on confluent-kafka.

Each micro-batch reads an exact offset range per topic-partition: the driver plans
``start -> end`` (Spark logs it before the batch runs), every input partition is one
topic-partition range, and ``read`` assigns, seeks and stops at ``end``. A replayed
batch therefore reads the same records. Output columns match Spark's Kafka source.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer, Message, TopicPartition
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from jobs import kafka_admin
from jobs.errors import ConfigError, SourceError
from jobs.faults import maybe_crash
from jobs.kafka_source import offsets as plan

SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int"
)
HEADERS_SCHEMA = ", headers array<struct<key:string,value:binary>>"
# With option batchWatermark: every row carries the event-time watermark its
# batch runs with (from Spark's offset log), so that records the aggregation would
# drop as late can be routed to the dead letters instead, the same way on a replay.
WATERMARK_COLUMN = "_batch_watermark_ms"  # as jobs.streaming.query's
WATERMARK_SCHEMA = f", {WATERMARK_COLUMN} long"
HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
ARROW_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("timestampType", pa.int32()),
    ]
)
ARROW_SCHEMA_WITH_HEADERS = ARROW_SCHEMA.append(pa.field("headers", HEADERS_TYPE))
FORMAT = "kafka_py"
CLIENT_PREFIX = "kafka."
# How long a read may see no progress before it calls the range unreachable.
READ_STALL_TIMEOUT_S = 60.0
CONSUME_BATCH = 10000
# An output batch closes at whichever comes first: large records must not pile up.
OUTPUT_BATCH_ROWS = 65536
OUTPUT_BATCH_BYTES = 32 * 1024 * 1024


# Records per task of a batch read (option maxRecordsPerPartition).
BATCH_SPLIT_RECORDS = 250_000


def _flag(lowered: dict[str, str], name: str) -> bool:
    value = lowered.get(name, "false").lower()
    if value not in ("true", "false"):
        raise ConfigError(f"option {name} must be true or false, got {value!r}")
    return value == "true"


class SourceOptions:
    """The source's options, validated once (they arrive as strings)."""

    def __init__(self, options: dict[str, str]) -> None:
        lowered = {k.lower(): v for k, v in options.items()}
        self.client = {
            k[len(CLIENT_PREFIX) :]: v for k, v in options.items() if k.startswith(CLIENT_PREFIX)
        }
        if "bootstrap.servers" not in self.client:
            raise ConfigError("the kafka source needs option kafka.bootstrap.servers")
        topics = [t.strip() for t in lowered.get("subscribe", "").split(",") if t.strip()]
        if not topics:
            raise ConfigError("the kafka source needs option subscribe (a comma list of topics)")
        self.topics = topics
        self.starting = plan.parse_starting_offsets(lowered.get("startingoffsets", "latest"))
        raw_ts = lowered.get("startingtimestamp")
        self.starting_timestamp: int | None = None
        if raw_ts is not None:
            if not raw_ts.isdigit():
                raise ConfigError(f"startingTimestamp must be epoch milliseconds, got {raw_ts!r}")
            self.starting_timestamp = int(raw_ts)
        self.include_headers = _flag(lowered, "includeheaders")
        # The query's checkpoint: its newest offset log entry is the batch being
        # planned (its id and watermark).
        self.checkpoint = lowered.get("checkpoint")
        self.batch_watermark = _flag(lowered, "batchwatermark")
        # Archive pipelines: each task also writes its range's records as a data file
        # of this (raw) table, for the batch to commit.
        self.archive_table = lowered.get("archivetable")
        raw_epoch = lowered.get("archiveepoch", "0")
        if not raw_epoch.isdigit():
            raise ConfigError(f"archiveEpoch must be a non-negative integer, got {raw_epoch!r}")
        self.archive_epoch = int(raw_epoch)
        if (self.batch_watermark or self.archive_table) and not self.checkpoint:
            raise ConfigError("batchWatermark and archiveTable need option checkpoint")
        # Set at a seeded cut: no records until the seed batch is committed.
        self.hold_until = lowered.get("holduntilfileexists")
        # A floor for the batch watermark (the watermark the application had
        # reached before its current cut).
        raw_floor = lowered.get("minwatermarkms", "0")
        if not raw_floor.isdigit():
            raise ConfigError(f"minWatermarkMs must be epoch milliseconds, got {raw_floor!r}")
        self.min_watermark_ms = int(raw_floor)
        raw_max = lowered.get("maxoffsetspertrigger")
        self.max_offsets: int | None = None
        if raw_max is not None:
            if not raw_max.isdigit() or int(raw_max) < 1:
                raise ConfigError(
                    f"maxOffsetsPerTrigger must be a positive integer, got {raw_max!r}"
                )
            self.max_offsets = int(raw_max)
        raw_split = lowered.get("maxrecordsperpartition", str(BATCH_SPLIT_RECORDS))
        if not raw_split.isdigit() or int(raw_split) < 1:
            raise ConfigError(
                f"maxRecordsPerPartition must be a positive integer, got {raw_split!r}"
            )
        self.max_records_per_partition = int(raw_split)

    def consumer_config(self) -> dict[str, Any]:
        return {
            "group.id": "platform-source",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            # Transactional producers: never show aborted or open transactions.
            "isolation.level": "read_committed",
            # An offset that is gone (retention during a read) must fail the read,
            # never jump to the log end or start: a short batch would commit.
            "auto.offset.reset": "error",
            "fetch.max.bytes": 52428800,
            "max.partition.fetch.bytes": 10485760,
            "queued.min.messages": 200000,
            **self.client,
        }


class KafkaDataSource(DataSource):
    """``spark.readStream.format("kafka_py")`` backed by confluent-kafka."""

    @classmethod
    def name(cls) -> str:
        # Spark reserves "kafka" for its JVM connector (whose jar does not exist here).
        return FORMAT

    def schema(self) -> str:
        # As Spark's Kafka source: a headers column only with includeHeaders=true.
        lowered = {k.lower(): v for k, v in self.options.items()}
        schema = SCHEMA
        if lowered.get("includeheaders", "false").lower() == "true":
            schema += HEADERS_SCHEMA
        if lowered.get("batchwatermark", "false").lower() == "true":
            schema += WATERMARK_SCHEMA
        return schema

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KafkaStreamReader(SourceOptions(dict(self.options)))

    def reader(self, schema: StructType) -> DataSourceReader:
        """Batch reads of an exact range: ``startingOffsets`` and ``endingOffsets`` as
        concrete JSON (what a backfill reads)."""
        options = SourceOptions(dict(self.options))
        lowered = {k.lower(): v for k, v in self.options.items()}
        if "endingoffsets" not in lowered or not isinstance(options.starting, dict):
            raise ConfigError(
                "a batch read of kafka_py needs concrete JSON startingOffsets and endingOffsets"
            )
        ending = plan.parse_starting_offsets(lowered["endingoffsets"])
        if not isinstance(ending, dict):
            raise ConfigError("endingOffsets must be JSON topic -> partition -> offset")
        return KafkaBatchReader(options, options.starting, ending)


class KafkaBatchReader(DataSourceReader):
    def __init__(self, options: SourceOptions, start: plan.Offsets, end: plan.Offsets) -> None:
        self.options = options
        # A batch read (a backfill, a drift check) splits long ranges: both cores
        # work on a one-partition topic, and progress is seen task by task.
        step = options.max_records_per_partition
        self.ranges = [
            InputPartition((tp[0], tp[1], begin, min(begin + step, end[tp])))
            for tp in sorted(end)
            for begin in range(start.get(tp, end[tp]), end[tp], step)
        ]

    def partitions(self) -> list[InputPartition]:
        return self.ranges

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        topic, part, start, end = partition.value
        yield from read_range(
            self.options.consumer_config(), topic, part, start, end, self.options.include_headers
        )


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._consumer: Consumer | None = None
        self._available_now_target: plan.Offsets | None = None

    # -- driver side ---------------------------------------------------------

    def _driver_consumer(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(self.options.consumer_config())
        return self._consumer

    def _partitions(self) -> dict[str, list[int]]:
        servers = self.options.client["bootstrap.servers"]
        return kafka_admin.topic_partitions(self._driver_consumer(), self.options.topics, servers)

    def _watermarks(
        self, partitions: dict[str, list[int]]
    ) -> dict[tuple[str, int], tuple[int, int]]:
        every = [(topic, p) for topic, parts in partitions.items() for p in parts]
        return kafka_admin.partition_watermarks(self._driver_consumer(), every)

    def _offsets_for_timestamp(
        self,
        partitions: dict[str, list[int]],
        marks: plan.Watermarks,
        timestamp_ms: int,
    ) -> plan.Offsets:
        wanted = [
            TopicPartition(t, p, timestamp_ms) for t, parts in partitions.items() for p in parts
        ]
        found = self._driver_consumer().offsets_for_times(wanted, timeout=10)
        # No record at or after the timestamp: start at the end of the partition.
        return {
            (tp.topic, tp.partition): tp.offset
            if tp.offset >= 0
            else marks[(tp.topic, tp.partition)][1]
            for tp in found
        }

    def initialOffset(self) -> dict[str, Any]:
        partitions = self._partitions()
        marks = self._watermarks(partitions)
        by_ts = None
        if self.options.starting_timestamp is not None:
            by_ts = self._offsets_for_timestamp(partitions, marks, self.options.starting_timestamp)
        start = plan.resolve_starting_offsets(self.options.starting, partitions, marks, by_ts)
        plan.check_not_expired(start, marks)
        return plan.to_json_dict(start)

    def prepareForTriggerAvailableNow(self) -> None:
        marks = self._watermarks(self._partitions())
        self._available_now_target = {tp: high for tp, (_low, high) in marks.items()}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_offsets)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        current = plan.from_json_dict(start)
        if self.options.hold_until and not os.path.exists(self.options.hold_until):
            return start
        partitions = self._partitions()
        marks = self._watermarks(partitions)
        plan.check_continuity(current, marks)
        plan.check_not_expired(current, marks)
        target = self._available_now_target
        if target is not None:
            # availableNow: nothing beyond what existed when the run started.
            marks = {
                tp: (low, min(high, target[tp]))
                for tp, (low, high) in marks.items()
                if tp in target
            }
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return plan.to_json_dict(plan.plan_end(current, marks, max_rows))

    def reportLatestOffset(self) -> dict[str, Any] | None:
        marks = self._watermarks(self._partitions())
        return plan.to_json_dict({tp: high for tp, (_low, high) in marks.items()})

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        first = plan.from_json_dict(start)
        last = plan.from_json_dict(end)
        batch_id, watermark = self._planned_batch(last)
        ranges = []
        for tp in sorted(last):
            begin = first.get(tp, last[tp])
            if last[tp] > begin:
                ranges.append(InputPartition((tp[0], tp[1], begin, last[tp], watermark, batch_id)))
        return ranges

    def _planned_batch(self, end: plan.Offsets) -> tuple[int | None, int | None]:
        """The id and watermark of the batch being planned: Spark wrote its offset log
        entry (the newest one) before asking for partitions, on a first run and a
        replay. Its end offsets must be the ones asked for."""
        if self.options.checkpoint is None:
            return None, None
        from jobs.streaming import offset_log

        checkpoint = Path(self.options.checkpoint)
        batches = offset_log.offset_batches(checkpoint)
        if not batches:
            raise SourceError(f"no offset log entry in {checkpoint} for the batch being planned")
        entry = offset_log.read_offsets(checkpoint, batches[-1])
        if plan.from_json_dict(entry.end_offsets) != end:
            raise SourceError(
                f"batch {entry.batch_id} of {checkpoint} ends at {entry.end_offsets}, but the "
                f"batch being planned ends at {plan.to_json_dict(end)}"
            )
        watermark = None
        if self.options.batch_watermark:
            watermark = max(entry.watermark_ms, self.options.min_watermark_ms)
        return entry.batch_id, watermark

    def commit(self, end: dict[str, Any]) -> None:
        """Offsets live in the checkpoint and the ledger, not in a consumer group."""

    def stop(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    # -- executor side ---------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        topic, part, start, end, watermark, batch_id = partition.value
        batches = read_range(
            self.options.consumer_config(), topic, part, start, end, self.options.include_headers
        )
        if self.options.archive_table is None:
            archive = None
        else:
            name = archive_file_name(self.options.archive_epoch, batch_id, topic, part, start, end)
            archive = ArchiveWriter(self.options.archive_table, name, self.options.archive_epoch)
        try:
            for batch in batches:
                if archive is not None:
                    archive.write(batch, batch_id)
                if watermark is not None:
                    column = pa.array([watermark] * batch.num_rows, pa.int64())
                    batch = batch.append_column(WATERMARK_COLUMN, column)
                yield batch
            if archive is not None:
                archive.close()
        except BaseException:
            if archive is not None:
                archive.abort()
            raise


def archive_file_prefix(
    epoch: int, batch_id: int, topic: str, partition: int, start: int, end: int
) -> str:
    """The name of a range's archive file up to its random part ("=" never occurs
    in a topic name, so no two ranges' prefixes overlap; a long topic name, up to
    249 characters in Kafka, is hashed to keep the name within file-system limits)."""
    if len(topic) > 80:
        topic = "h" + hashlib.sha256(topic.encode()).hexdigest()[:32]
    return f"part-e{epoch}-b{batch_id}-{topic}={partition}={start}={end}="


def archive_file_name(
    epoch: int, batch_id: int, topic: str, partition: int, start: int, end: int
) -> str:
    prefix = archive_file_prefix(epoch, batch_id, topic, partition, start, end)
    return f"{prefix}{uuid.uuid4().hex[:16]}.parquet"


class ArchiveWriter:
    """A range's raw records as a data file of the ``raw`` table (always written,
    even without a record: the batch expects one file per range)."""

    def __init__(self, table: str, name: str, epoch: int) -> None:
        from jobs.delta.files import DataFileWriter
        from jobs.delta.layout import RAW_SCHEMA

        self.schema = RAW_SCHEMA
        self.epoch = epoch
        self.out = DataFileWriter(Path(table), name, RAW_SCHEMA, eager=True)

    def write(self, batch: pa.RecordBatch, batch_id: int) -> None:
        n = batch.num_rows
        columns = [batch.column(name) for name in self.schema.names[:-2]]
        columns += [pa.array([self.epoch] * n, pa.int64()), pa.array([batch_id] * n, pa.int64())]
        self.out.write(pa.RecordBatch.from_arrays(columns, schema=self.schema))

    def close(self) -> None:
        self.out.close()

    def abort(self) -> None:
        self.out.abort()


def read_range(
    config: dict[str, Any],
    topic: str,
    partition: int,
    start: int,
    end: int,
    include_headers: bool = False,
) -> Iterator[pa.RecordBatch]:
    """Exactly the records at offsets [start, end) of one partition, as Arrow batches."""
    consumer = Consumer(config)
    try:
        low, _high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
        plan.check_not_expired({(topic, partition): start}, {(topic, partition): (low, _high)})
        consumer.assign([TopicPartition(topic, partition, start)])
        builder = _BatchBuilder(topic, partition, include_headers)
        position = start
        last_progress = time.monotonic()
        while position < end:
            # Ask for no more than the range holds: consume() waits out its timeout
            # until it has that many, so at the log end a full-size request idled
            # 0.5 s per task (measured: 1,000 records took 1.2 s, warm).
            messages = consumer.consume(min(CONSUME_BATCH, end - position), 0.5)
            failed = [m for m in messages if m.error() is not None]
            if failed:
                errors = [kafka_admin.read_error(m, topic, partition) for m in failed]
                err = next((e for e in errors if e is not None), None)
                if err is not None:
                    raise SourceError(
                        f"error reading {topic}[{partition}] at offset {position}: {err}; nothing "
                        "of the batch is committed (the next run retries it; if the records were "
                        "deleted by retention, see python -m jobs status for the repair)"
                    )
                messages = [m for m in messages if m.error() is None]
            kept = messages
            if messages and _offset(messages[-1]) >= end:
                kept = [m for m in messages if _offset(m) < end]
            if kept and _offset(kept[0]) > position:
                _check_not_deleted(consumer, topic, partition, position)
            if kept:
                builder.add(kept)
                maybe_crash("during_read")
                position = _offset(kept[-1]) + 1
                last_progress = time.monotonic()
                if builder.rows >= OUTPUT_BATCH_ROWS or builder.bytes >= OUTPUT_BATCH_BYTES:
                    yield builder.flush()
            if position < end:
                # Control records (transaction markers) and aborted records occupy
                # offsets that read_committed never delivers: trust the position.
                tp_pos = consumer.position([TopicPartition(topic, partition)])[0].offset
                if tp_pos >= end:
                    _check_not_deleted(consumer, topic, partition, position)
                    break
                if time.monotonic() - last_progress > READ_STALL_TIMEOUT_S:
                    raise SourceError(
                        f"no progress reading {topic}[{partition}] offsets {position}..{end - 1} "
                        f"for {READ_STALL_TIMEOUT_S:.0f} s"
                    )
        if builder.rows:
            yield builder.flush()
    finally:
        consumer.close()


def _check_not_deleted(consumer: Consumer, topic: str, partition: int, position: int) -> None:
    """Offsets skipped by the log are fine for transaction markers and compaction, but
    records deleted under the read (retention) would make the batch short."""
    low, _high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
    if low > position:
        raise SourceError(
            f"{topic}[{partition}] records {position}..{low - 1} were deleted by retention while "
            "the batch read them; nothing of the batch is committed. Repair: raise the topic's "
            "retention, then python -m jobs rewind --mode skip --reason ... to accept the loss "
            "explicitly (or backfill --source archive)"
        )


def _offset(message: Message) -> int:
    offset = message.offset()
    assert offset is not None  # only error events lack an offset; they are filtered
    return offset


class _BatchBuilder:
    """Column lists for one partition's records, turned into Arrow batches."""

    def __init__(self, topic: str, partition: int, include_headers: bool) -> None:
        self.topic = topic
        self.partition = partition
        self.include_headers = include_headers
        self._reset()

    def _reset(self) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.offsets: list[int] = []
        self.timestamps: list[int] = []
        self.types: list[int] = []
        self.headers: list[list[dict[str, Any]]] = []
        self.rows = 0
        self.bytes = 0

    def add(self, messages: list[Any]) -> None:
        self.keys.extend([m.key() for m in messages])
        self.values.extend([m.value() for m in messages])
        self.offsets.extend([m.offset() for m in messages])
        stamps = [m.timestamp() for m in messages]
        # librdkafka: 0 none, 1 create, 2 log-append; Spark/Kafka: -1, 0, 1.
        self.types.extend([s[0] - 1 for s in stamps])
        self.timestamps.extend([s[1] * 1000 for s in stamps])
        if self.include_headers:
            self.headers.extend(
                [[{"key": k, "value": v} for k, v in (m.headers() or [])] for m in messages]
            )
        self.rows += len(messages)
        self.bytes += sum(len(m.value() or b"") + len(m.key() or b"") for m in messages)

    def flush(self) -> pa.RecordBatch:
        n = self.rows
        columns = [
            pa.array(self.keys, pa.binary()),
            pa.array(self.values, pa.binary()),
            pa.array([self.topic] * n, pa.string()),
            pa.array([self.partition] * n, pa.int32()),
            pa.array(self.offsets, pa.int64()),
            pa.array(self.timestamps, pa.timestamp("us", tz="UTC")),
            pa.array(self.types, pa.int32()),
        ]
        schema = ARROW_SCHEMA
        if self.include_headers:
            columns.append(pa.array(self.headers, HEADERS_TYPE))
            schema = ARROW_SCHEMA_WITH_HEADERS
        batch = pa.RecordBatch.from_arrays(columns, schema=schema)
        self._reset()
        return batch
