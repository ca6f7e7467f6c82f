"""Publishing an application's ``state`` versions to its output topic, exactly once.

Each state version with changes goes out in one Kafka transaction (records of a
batch, or an operation's corrections, all or nothing for a ``read_committed``
consumer). How a replay knows what is already in the topic: the **bookmark**.
The same transaction commits, as the offset of partition 0 of the output topic
for the consumer group ``platform-output.<application>``, the next state version
to publish (``send_offsets_to_transaction``, the way Kafka Streams commits its
input offsets with its output). Records and bookmark commit together or not at
all, so after a crash anywhere the next publisher starts from the first version
whose transaction did not commit.

Zombies: the ``transactional.id`` is ``platform-output.<application>``. Opening a
publisher (``init_transactions``) aborts a transaction a killed one left open and
fences every older producer of the application: a stream that an operation
fenced in Delta cannot publish either. The bookmark is read after that, so no
other publisher can move it while this one runs.

A pipeline whose topic has no bookmark yet (new, or output just configured)
starts with a snapshot of the whole state. A bookmark that cannot be trusted (a
topic recreated, a state table newer than it, versions no longer readable) stops
publishing with one error naming the repair: ``python -m jobs publish --snapshot``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from deltalake import DeltaTable

from jobs import kafka_admin
from jobs.delta.layout import AppLayout
from jobs.errors import ConsistencyError, FencedError, OutputError, SourceError
from jobs.faults import maybe_crash
from jobs.ledger import current_epoch
from jobs.output.changes import VersionChanges, commit_infos, net_changes, snapshot
from jobs.output.records import encode, headers
from jobs.pipeline import Output, Pipeline

log = logging.getLogger(__name__)
NAME_PREFIX = "platform-output."
TIMEOUT_S = 30.0
TRANSACTION_TIMEOUT_MS = 120_000


@dataclass(frozen=True)
class Bookmark:
    next_version: int  # the first state version not in the topic
    topic_id: str | None  # of the topic it was written to, when the broker has ids


@dataclass(frozen=True)
class Published:
    version: int
    kind: str
    records: int


def transactional_id(application_id: str) -> str:
    return NAME_PREFIX + application_id


def bookmark_group(application_id: str) -> str:
    return NAME_PREFIX + application_id


def repair(application_id: str) -> str:
    return (
        f"repair: python -m jobs publish --pipeline {application_id} --snapshot "
        "(publishes the whole state, marked snapshot, and starts from it)"
    )


def _group_consumer(config: dict[str, Any], application_id: str) -> Consumer:
    return Consumer(
        {
            **config,
            "group.id": bookmark_group(application_id),
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )


def _read_bookmark(consumer: Consumer, output: Output) -> Bookmark | None:
    try:
        found = consumer.committed([TopicPartition(output.topic, 0)], TIMEOUT_S)[0]
    except KafkaException as exc:
        raise OutputError(f"cannot read the output bookmark of {output.topic!r}: {exc}") from exc
    if found.error is not None:
        raise OutputError(f"cannot read the output bookmark of {output.topic!r}: {found.error}")
    if found.offset < 0:
        return None
    meta: dict[str, Any] = {}
    if found.metadata:
        try:
            meta = json.loads(found.metadata)
        except ValueError:
            meta = {}
    return Bookmark(found.offset, meta.get("topic_id"))


def read_bookmark(config: dict[str, Any], pipeline: Pipeline) -> Bookmark | None:
    """What the output topic holds (read-only: ``maintain`` and ``status`` use it)."""
    assert pipeline.output is not None
    consumer = _group_consumer(config, pipeline.application_id)
    try:
        return _read_bookmark(consumer, pipeline.output)
    finally:
        consumer.close()


class OutputPublisher:
    """The one writer of an application's output topic while it is open."""

    def __init__(self, pipeline: Pipeline, layout: AppLayout, config: dict[str, Any]) -> None:
        if pipeline.output is None:
            raise ValueError(f"{pipeline.application_id} has no output topic")
        self.pipeline = pipeline
        self.output: Output = pipeline.output
        self.layout = layout
        self.state = layout.table("state")
        self.config = config
        self.producer: Producer | None = None
        self.consumer: Consumer | None = None
        self.partitions = 0
        self.topic_id: str | None = None
        self.bookmark: Bookmark | None = None

    def __enter__(self) -> OutputPublisher:
        self.open()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def open(self, republish: bool = False) -> None:
        """Take over the topic. ``republish``: the caller publishes a snapshot next,
        so an untrusted bookmark is not an error (it is the repair)."""
        self._ensure_topic()
        self.producer = Producer(
            {
                **self.config,
                "transactional.id": transactional_id(self.pipeline.application_id),
                "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
                "linger.ms": 5,
            }
        )
        try:
            # Aborts what a killed publisher left open; fences older producers.
            self.producer.init_transactions(TIMEOUT_S)
        except KafkaException as exc:
            raise OutputError(
                f"cannot start publishing to output topic {self.output.topic!r}: {exc}"
            ) from exc
        self.consumer = _group_consumer(self.config, self.pipeline.application_id)
        self.bookmark = _read_bookmark(self.consumer, self.output)
        if not republish:
            self._check_bookmark()

    def close(self) -> None:
        if self.consumer is not None:
            self.consumer.close()
            self.consumer = None
        # Every transaction is committed or aborted before this: nothing is waiting
        # to be sent (a fenced producer's queue never drains; it is dropped).
        self.producer = None

    def _ensure_topic(self) -> None:
        client = kafka_admin.admin(self.config)
        try:
            metadata = client.list_topics(timeout=TIMEOUT_S)
        except KafkaException as exc:
            raise OutputError(f"cannot reach the Kafka broker for the output: {exc}") from exc
        topic = metadata.topics.get(self.output.topic)
        if topic is None or topic.error is not None or not topic.partitions:
            log.info(
                "creating output topic %s (%d partition(s))",
                self.output.topic,
                self.output.partitions,
            )
            try:
                kafka_admin.create_topic(client, self.output.topic, self.output.partitions)
                self.partitions = len(
                    kafka_admin.topic_partitions(client, [self.output.topic])[self.output.topic]
                )
            except SourceError as exc:
                raise OutputError(str(exc)) from exc
        else:
            self.partitions = len(topic.partitions)
        self.topic_id = kafka_admin.topic_ids(client, [self.output.topic]).get(self.output.topic)

    def _check_bookmark(self) -> None:
        app, topic = self.pipeline.application_id, self.output.topic
        current = DeltaTable(str(self.state)).version()
        mark = self.bookmark
        if mark is None:
            marks = kafka_admin.watermarks(
                self.config, [(topic, p) for p in range(self.partitions)]
            )
            if any(high > 0 for _low, high in marks.values()):
                raise OutputError(
                    f"output topic {topic!r} has records but no bookmark of what {app} "
                    f"published (consumer group {bookmark_group(app)}): another writer, or "
                    f"the group was deleted; {repair(app)}"
                )
            return
        if mark.topic_id and self.topic_id and mark.topic_id != self.topic_id:
            raise OutputError(
                f"output topic {topic!r} was deleted and recreated since {app} last published "
                f"to it (topic id {mark.topic_id}, now {self.topic_id}); {repair(app)}"
            )
        if mark.next_version > current + 1:
            raise OutputError(
                f"output topic {topic!r} holds {app}'s state up to version "
                f"{mark.next_version - 1}, but the state table is only at version {current}: "
                f"the table was replaced; {repair(app)}"
            )

    # -- publishing -------------------------------------------------------------

    def publish_pending(self) -> list[Published]:
        """Every state version not yet in the topic, one transaction each (a first
        publish: a snapshot)."""
        current = DeltaTable(str(self.state)).version()
        if self.bookmark is None:
            return [self._snapshot(current)]
        first = self.bookmark.next_version
        if first > current:
            return []
        try:
            infos = commit_infos(self.state, first, current)
            published = []
            for version in range(first, current + 1):
                changes = net_changes(self.pipeline, self.state, version, infos[version])
                if changes.num_records or version == current:
                    # An empty version needs no transaction of its own: the next one's
                    # bookmark moves past it, and the newest always gets one.
                    published.append(self._transaction(changes))
        except (ConsistencyError, OSError) as exc:
            if isinstance(exc, ConsistencyError) and "damaged" in str(exc):
                raise
            raise OutputError(
                f"state versions {first}..{current} of {self.pipeline.application_id} cannot "
                f"be read for the output topic ({exc}); {repair(self.pipeline.application_id)}"
            ) from exc
        return [p for p in published if p.records]

    def publish_snapshot(self) -> Published:
        return self._snapshot(DeltaTable(str(self.state)).version())

    def _snapshot(self, version: int) -> Published:
        epoch = current_epoch(self.layout)
        return self._transaction(snapshot(self.pipeline, self.state, version, epoch))

    def _transaction(self, changes: VersionChanges) -> Published:
        """``changes`` and the bookmark past them in one transaction. (Crash tests
        aim their faults at the batch whose changes these are.)"""
        producer = self.producer
        assert producer is not None and self.consumer is not None
        next_version = changes.version + 1
        meta = json.dumps({"topic_id": self.topic_id, "state_version": next_version - 1})
        started = time.monotonic()
        try:
            producer.begin_transaction()
            self._produce(producer, changes)
            producer.flush(TIMEOUT_S)
            maybe_crash("during_output", changes.batch_id)
            producer.send_offsets_to_transaction(
                [TopicPartition(self.output.topic, 0, next_version, metadata=meta)],
                self.consumer.consumer_group_metadata(),
                TIMEOUT_S,
            )
            producer.commit_transaction(TIMEOUT_S)
        except KafkaException as exc:
            self._failed(producer, exc, changes)
        maybe_crash("after_output", changes.batch_id)
        self.bookmark = Bookmark(next_version, self.topic_id)
        log.info(
            "%s: state version %d (%s, %s) published to %s: %d record(s) in %.2f s",
            self.pipeline.application_id,
            changes.version,
            changes.kind,
            changes.operation,
            self.output.topic,
            changes.num_records,
            time.monotonic() - started,
        )
        return Published(changes.version, changes.kind, changes.num_records)

    def _produce(self, producer: Producer, changes: VersionChanges) -> None:
        record_headers = headers(self.pipeline.application_id, changes)
        for key, value, partition in encode(self.pipeline, changes, self.partitions):
            while True:
                try:
                    producer.produce(
                        self.output.topic,
                        key=key,
                        value=value,
                        partition=partition,
                        headers=record_headers,
                    )
                    break
                except BufferError:  # the local queue is full: let it drain
                    producer.poll(0.1)

    def _failed(self, producer: Producer, exc: KafkaException, changes: VersionChanges) -> None:
        error = exc.args[0] if exc.args else None
        app, topic = self.pipeline.application_id, self.output.topic
        if isinstance(error, KafkaError) and (error.code() == KafkaError._FENCED or error.fatal()):
            raise FencedError(
                f"another publisher of {app} took over output topic {topic!r} (transactional "
                f"id {transactional_id(app)}); this one stops, state version "
                f"{changes.version} is left to it"
            ) from exc
        if isinstance(error, KafkaError) and error.txn_requires_abort():
            with contextlib.suppress(KafkaException):  # else the next init_transactions does
                producer.abort_transaction(TIMEOUT_S)
        raise OutputError(
            f"could not publish state version {changes.version} of {app} to {topic!r} "
            f"(nothing of it is visible; the next run publishes it): {exc}"
        ) from exc


def open_publisher(
    pipeline: Pipeline, layout: AppLayout, config: dict[str, Any]
) -> OutputPublisher | None:
    """An open publisher when the pipeline has an output topic, else None."""
    if pipeline.output is None:
        return None
    publisher = OutputPublisher(pipeline, layout, config)
    publisher.open()
    return publisher


def versions_needed(layout: AppLayout, bookmark: Bookmark | None) -> range:
    """State versions the output still has to read (``maintain`` keeps them): from
    the one before the bookmark (a restore's deletes come from its files) on."""
    current = DeltaTable(str(layout.table("state"))).version()
    first = 0 if bookmark is None else max(0, bookmark.next_version - 1)
    return range(first, current + 1)
