"""Writing a batch's dead letters with bounded memory.

Spark tells the driver only where the dead letters are and why (topic, partition,
offset, Kafka timestamp, reason: a few hundred bytes each, through the batch's
observed metrics). Their keys and values are read back from Kafka by position and
streamed into one Delta commit in Arrow batches of at most ``BATCH_BYTES``: a
burst of large bad records never sits in the driver at once, nor in Spark's
progress history.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer, TopicPartition

from jobs import kafka_admin
from jobs.delta import layout as tables
from jobs.errors import KafkaUnavailableError, SourceError

log = logging.getLogger(__name__)

BATCH_BYTES = 16 * 1024 * 1024
# Reading on is cheaper than seeking when the next wanted offset is this close.
SEEK_GAP = 500
STALL_TIMEOUT_S = 60.0


def dead_letter_batches(
    consumer_config: Mapping[str, Any],
    letters: list[dict[str, Any]],
    stamp: Mapping[str, Any],
) -> Iterator[pa.RecordBatch]:
    """Dead-letter rows, ``letters`` completed with their keys and values from Kafka.

    ``stamp`` holds the columns every row shares (epoch, batch_id, commit_time).
    """
    wanted: dict[tuple[str, int], dict[int, dict[str, Any]]] = {}
    for letter in letters:
        wanted.setdefault((letter["topic"], int(letter["partition"])), {})[
            int(letter["offset"])
        ] = letter
    rows: list[dict[str, Any]] = []
    size = 0
    consumer = Consumer(
        {
            # As the source reads: a client setting may change the isolation level.
            "isolation.level": "read_committed",
            **consumer_config,
            "group.id": "platform-dead-letters",
            "enable.auto.commit": False,
            "auto.offset.reset": "error",
        }
    )
    try:
        for (topic, partition), by_offset in sorted(wanted.items()):
            for offset, key, value in _records_at(consumer, topic, partition, sorted(by_offset)):
                letter = by_offset[offset]
                rows.append(
                    {
                        "topic": topic,
                        "partition": partition,
                        "offset": offset,
                        "key": key,
                        "value": value,
                        "kafka_timestamp": letter.get("kafka_timestamp"),
                        "reason": letter["reason"],
                        **stamp,
                    }
                )
                size += len(key or b"") + len(value or b"")
                if size >= BATCH_BYTES:
                    yield pa.RecordBatch.from_pylist(rows, schema=tables.DEAD_LETTER_SCHEMA)
                    rows, size = [], 0
    finally:
        consumer.close()
    if rows:
        yield pa.RecordBatch.from_pylist(rows, schema=tables.DEAD_LETTER_SCHEMA)


def _records_at(
    consumer: Consumer, topic: str, partition: int, offsets: list[int]
) -> Iterator[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of exactly ``offsets`` (sorted) of one partition.

    The batch has just read these records, so each must be there: a missing one
    (deleted by retention since) is an error, never a dead letter without its value.
    """
    position = -1
    for offset in offsets:
        if position < 0 or offset - position > SEEK_GAP:
            consumer.assign([TopicPartition(topic, partition, offset)])
            position = offset
        deadline = time.monotonic() + STALL_TIMEOUT_S
        while position <= offset:
            message = consumer.poll(0.5)
            if message is None:
                if time.monotonic() > deadline:
                    raise KafkaUnavailableError(
                        f"dead letter {topic}[{partition}]@{offset} could not be read back "
                        f"within {STALL_TIMEOUT_S:.0f} s"
                    )
                continue
            if message.error() is not None:
                error = kafka_admin.read_error(message, topic, partition)
                if error is None:
                    continue
                raise SourceError(
                    f"dead letter {topic}[{partition}]@{offset} could not be read back: {error}; "
                    "the batch is not committed (it is replayed by the next run)"
                )
            got = message.offset()
            assert got is not None
            position = got + 1
            if got == offset:
                yield offset, message.key(), message.value()
            elif got > offset:
                raise SourceError(
                    f"dead letter {topic}[{partition}]@{offset} is no longer in the log "
                    f"(the next record is {got}); the batch is not committed"
                )


def batch_reader(
    consumer_config: Mapping[str, Any],
    letters: list[dict[str, Any]],
    stamp: Mapping[str, Any],
) -> Callable[[], pa.RecordBatchReader]:
    """A factory of fresh readers (a commit that conflicts is attempted again)."""

    def make() -> pa.RecordBatchReader:
        return pa.RecordBatchReader.from_batches(
            tables.DEAD_LETTER_SCHEMA, dead_letter_batches(consumer_config, letters, stamp)
        )

    return make
