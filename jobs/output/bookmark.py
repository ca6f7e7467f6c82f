"""The bookmark: what an application's output topic already holds.

It is the offset of partition 0 of the output topic committed for the consumer
group ``platform-output.<application>``, inside each output transaction
(``send_offsets_to_transaction``): the next state version to publish. Its
metadata says where it was written: the topic's id (when the broker has ids), the
state table's id, the partition count keys were spread over, and how many
records were published, so that a topic or table replaced under the application
is recognised instead of trusted.

Kafka expires the offsets of a group without members (``offsets.retention.minutes``,
7 days by default), so a bookmark can vanish while the application is idle.
Then it is recovered from the records themselves: every record carries the
state version it came from in a header, and the versions between the newest one
found and the table's current one had no records (each version with records is
one transaction). A last record that is not the application's is someone
else's: that is never guessed at.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from jobs import kafka_admin
from jobs.errors import KafkaUnavailableError, OutputError
from jobs.output.encoding import HEADER_PREFIX

NAME_PREFIX = "platform-output."
TIMEOUT_S = 30.0
TAIL_RECORDS = 64  # read back this far from a partition's end, doubling until found


@dataclass(frozen=True)
class Bookmark:
    next_version: int  # the first state version not in the topic
    topic_id: str | None = None
    table_id: str | None = None
    partitions: int | None = None
    records: int | None = None  # published so far (None: recovered, unknown)
    recovered: bool = False  # rebuilt from the records (the committed offset expired)

    def metadata(self) -> str:
        data = asdict(self)
        del data["next_version"], data["recovered"]
        return json.dumps(data, sort_keys=True)


def group_id(application_id: str) -> str:
    return NAME_PREFIX + application_id


def group_consumer(config: dict[str, Any], application_id: str) -> Consumer:
    """A consumer of the bookmark's group: it never subscribes or commits itself."""
    return Consumer(
        {
            **config,
            "group.id": group_id(application_id),
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,  # a partition's end is an event (a recovery's read)
        }
    )


def read(consumer: Consumer, application_id: str, topic: str) -> Bookmark | None:
    """The committed bookmark, else the one the records show, else None (empty)."""
    found = _committed(consumer, topic)
    if found.offset < 0:
        return recover(consumer, application_id, topic)
    try:
        meta = json.loads(found.metadata) if found.metadata else {}
    except ValueError:
        meta = {}
    if not isinstance(meta, dict):
        meta = {}
    return Bookmark(
        found.offset,
        topic_id=meta.get("topic_id"),
        table_id=meta.get("table_id"),
        partitions=meta.get("partitions"),
        records=meta.get("records"),
    )


def _committed(consumer: Consumer, topic: str) -> TopicPartition:
    """The bookmark's committed offset. A group coordinator that is loading or moved
    (a new cluster's first group, a failover) answers "not now": asked again until
    ``TIMEOUT_S``, as Kafka's Java consumer does."""
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        try:
            found: TopicPartition = consumer.committed([TopicPartition(topic, 0)], TIMEOUT_S)[0]
            if found.error is None:
                return found
            exc = KafkaException(found.error)
        except KafkaException as raised:
            exc = raised
        failure = unreached(f"cannot read the output bookmark of {topic!r}", exc)
        if isinstance(failure, OutputError) or time.monotonic() > deadline:
            raise failure from exc
        time.sleep(0.5)


def unreached(what: str, exc: KafkaException) -> OutputError | KafkaUnavailableError:
    """``what`` failed: Kafka did not answer, or answered "not now" while a leader or
    coordinator moves (a continuous run waits for it), or an error of the output's."""
    error = kafka_admin.kafka_error(what, exc)
    return error if isinstance(error, KafkaUnavailableError) else OutputError(str(error))


def recover(consumer: Consumer, application_id: str, topic: str) -> Bookmark | None:
    """From the newest committed record of every partition (None: no records)."""
    try:
        partitions = sorted(consumer.list_topics(topic, TIMEOUT_S).topics[topic].partitions)
    except (KafkaException, KeyError) as exc:
        raise OutputError(f"cannot list the partitions of {topic!r}: {exc}") from exc
    newest: int | None = None
    for partition in partitions:
        headers = _last_record_headers(consumer, topic, partition)
        if headers is None:
            continue
        if headers.get(HEADER_PREFIX + "application") != application_id.encode():
            raise OutputError(
                f"output topic {topic!r} has records of another writer (the newest in "
                f"partition {partition} is not {application_id}'s) and no bookmark of what "
                f"{application_id} published; use a topic of its own, or "
                f"{repair(application_id)}"
            )
        version = int(headers[HEADER_PREFIX + "state_version"])
        newest = version if newest is None else max(newest, version)
    if newest is None:
        return None
    return Bookmark(newest + 1, partitions=len(partitions), recovered=True)


def _last_record_headers(consumer: Consumer, topic: str, partition: int) -> dict[str, bytes] | None:
    """The headers of the partition's newest committed record (aborted ones and
    transaction markers are skipped by read_committed), reading back from the end."""
    tp = TopicPartition(topic, partition)
    try:
        low, high = consumer.get_watermark_offsets(tp, TIMEOUT_S)
    except KafkaException as exc:
        raise unreached(f"cannot read the offsets of {topic}[{partition}]", exc) from exc
    back = TAIL_RECORDS
    while high > low:
        start = max(low, high - back)
        consumer.assign([TopicPartition(topic, partition, start)])
        try:
            last = _newest_until_the_end(consumer, topic, partition)
        finally:
            consumer.unassign()
        if last is not None:
            found: dict[str, bytes] = {}
            for header in last.headers() or []:
                if isinstance(header, tuple) and isinstance(header[1], bytes):
                    found[str(header[0])] = header[1]
            return found
        if start == low:
            return None
        back *= 2
    return None


def _newest_until_the_end(consumer: Consumer, topic: str, partition: int) -> Any:
    """The newest committed record from the assigned position to the partition's end.
    Only Kafka's end-of-partition event ends the read (``enable.partition.eof``):
    a fetch that returns nothing may be a leader moving, and aborted records and
    transaction markers are never returned at all."""
    deadline = time.monotonic() + TIMEOUT_S
    last = None
    while True:
        for message in consumer.consume(1000, 1.0):
            error = message.error()
            if error is None:
                last = message
            elif error.code() == KafkaError._PARTITION_EOF:
                return last
            else:
                raise unreached(f"cannot read {topic}[{partition}]", KafkaException(error))
        if time.monotonic() > deadline:
            raise KafkaUnavailableError(
                f"cannot read {topic}[{partition}] to its end within {TIMEOUT_S:.0f} s"
            )


def repair(application_id: str) -> str:
    return (
        f"repair: python -m jobs publish --pipeline {application_id} --snapshot "
        "--reason ... (publishes the whole state, marked snapshot, and starts from it)"
    )
