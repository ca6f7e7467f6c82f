"""Publishing an application's ``state`` versions to its output topic, exactly once.

Each state version with changes goes out in one Kafka transaction (a batch's
records, or an operation's corrections: all or nothing for a ``read_committed``
consumer). How a replay knows what is already in the topic: the same
transaction commits the bookmark, the next state version to publish
(``bookmark.py``), the way Kafka Streams commits its input offsets with its
output. Records and bookmark commit together or not at all, so after a crash
anywhere the next publisher starts from the first version whose transaction did
not commit.

Zombies: the ``transactional.id`` is ``platform-output.<application>``. Opening a
publisher (``init_transactions``) aborts a transaction a killed one left open and
fences every older producer of the application: a stream that an operation
fenced in Delta cannot publish either. The bookmark is read after that, so no
other publisher can move it while this one runs.

A topic without a bookmark and without records (new, or output just configured)
starts with a snapshot of the whole state. A bookmark that cannot be trusted (the
topic or the state table replaced, the partition count changed, versions no
longer readable) stops publishing with one error naming the repair.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from deltalake import DeltaTable

from jobs import kafka_admin
from jobs.delta.layout import AppLayout
from jobs.errors import (
    ConsistencyError,
    FencedError,
    KafkaUnavailableError,
    OutputError,
    SourceError,
)
from jobs.faults import maybe_crash
from jobs.ledger import current_epoch
from jobs.output import bookmark
from jobs.output.bookmark import Bookmark, repair
from jobs.output.changes import VersionChanges, commit_infos, net_changes, snapshot
from jobs.output.encoding import encode, headers
from jobs.pipeline.model import Output, Pipeline
from jobs.resolution import Resolved

log = logging.getLogger(__name__)
T = TypeVar("T")
TIMEOUT_S = 30.0
STUCK_GRACE_S = 5.0
STUCK_ATTEMPTS = 3
# Kafka's default ceiling (transaction.max.timeout.ms): a snapshot or a correction
# of millions of rows is one transaction and must fit in it.
TRANSACTION_TIMEOUT_MS = 900_000
# A topic the platform creates keeps the last value of every key and window.
CREATED_TOPIC_CONFIG = {"cleanup.policy": "compact"}
FENCED_CODES = {
    KafkaError._FENCED,
    KafkaError.PRODUCER_FENCED,
    KafkaError.INVALID_PRODUCER_EPOCH,
}


@dataclass(frozen=True)
class Published:
    version: int
    kind: str
    records: int


def transactional_id(application_id: str) -> str:
    return bookmark.NAME_PREFIX + application_id


def read_bookmark(config: dict[str, Any], pipeline: Pipeline) -> Bookmark | None:
    """What the output topic holds (read-only: ``maintain`` and ``status`` use it)."""
    assert pipeline.output is not None
    consumer = bookmark.group_consumer(config, pipeline.application_id)
    try:
        return bookmark.read(consumer, pipeline.application_id, pipeline.output.topic)
    finally:
        consumer.close()


def versions_needed(layout: AppLayout, mark: Bookmark | None) -> range:
    """State versions the output still has to read (``maintain`` keeps them): from
    the one before the bookmark (a restore's deletes come from its files) on; with
    no bookmark, only the current one (a snapshot)."""
    current = DeltaTable(str(layout.table("state"))).version()
    if mark is None or mark.next_version > current:
        return range(current, current + 1)
    return range(max(0, mark.next_version - 1), current + 1)


class OutputPublisher:
    """The one writer of an application's output topic while it is open."""

    def __init__(self, resolved: Resolved, layout: AppLayout, config: dict[str, Any]) -> None:
        pipeline = resolved.pipeline
        if pipeline.output is None:
            raise ValueError(f"{pipeline.application_id} has no output topic")
        self.resolved = resolved
        self.pipeline = pipeline
        self.app = pipeline.application_id
        self.output: Output = pipeline.output
        self.layout = layout
        self.state = layout.table("state")
        self.config = config
        self.producer: Producer | None = None
        self.consumer: Consumer | None = None
        self.partitions = 0
        self.topic_id: str | None = None
        self.table_id: str | None = None
        self.bookmark: Bookmark | None = None

    def __enter__(self) -> OutputPublisher:
        self.open()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def open(self, republish: bool = False) -> None:
        """Take over the topic. ``republish``: the caller publishes a snapshot next,
        so an untrusted bookmark is not an error (the snapshot is the repair)."""
        self._ensure_topic()
        self.table_id = str(DeltaTable(str(self.state)).metadata().id)
        self.producer = self._new_producer()
        self.consumer = bookmark.group_consumer(self.config, self.app)
        if republish:
            self.bookmark = None
            return
        self.bookmark = bookmark.read(self.consumer, self.app, self.output.topic)
        self._check_bookmark()
        if self.bookmark is not None and self.bookmark.recovered:
            log.warning(
                "%s: the bookmark of output topic %s had expired; recovered from its records: "
                "state version %d is the next to publish",
                self.app,
                self.output.topic,
                self.bookmark.next_version,
            )

    def _new_producer(self) -> Producer:
        producer = Producer(
            {
                **self.config,
                "transactional.id": transactional_id(self.app),
                "acks": "all",  # as transactions require: every in-sync replica
                "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
                "linger.ms": 5,
            }
        )
        try:
            # Aborts what a killed publisher left open; fences older producers.
            producer.init_transactions(TIMEOUT_S)
        except KafkaException as exc:
            what = f"cannot start publishing to output topic {self.output.topic!r}"
            raise bookmark.unreached(what, exc) from exc
        return producer

    def close(self) -> None:
        if self.consumer is not None:
            self.consumer.close()
            self.consumer = None
        # Every transaction was committed or aborted: nothing waits to be sent (a
        # fenced producer's queue never drains, so it is not flushed).
        self.producer = None

    def _ensure_topic(self) -> None:
        client = kafka_admin.admin(self.config)
        topic = self.output.topic
        try:
            metadata = client.list_topics(timeout=TIMEOUT_S)
        except KafkaException as exc:
            kafka_admin.serve_callbacks(client)
            raise bookmark.unreached("cannot reach the Kafka broker for the output", exc) from exc
        found = metadata.topics.get(topic)
        try:
            if found is None or found.error is not None or not found.partitions:
                log.info(
                    "creating output topic %s (%d partition(s))", topic, self.output.partitions
                )
                created = kafka_admin.create_topic(
                    client, topic, self.output.partitions, CREATED_TOPIC_CONFIG
                )
                self.partitions, self.topic_id = len(created.partitions), created.topic_id
                return
            self.partitions = len(found.partitions)
            self.topic_id = kafka_admin.topic_ids(client, [topic]).get(topic)
        except KafkaUnavailableError:
            raise  # a continuous run waits for the brokers (jobs/streaming/outage.py)
        except SourceError as exc:
            raise OutputError(str(exc)) from exc

    def _check_bookmark(self) -> None:
        app, topic, mark = self.app, self.output.topic, self.bookmark
        if mark is None:
            return  # no records either (bookmark.read): a snapshot starts it
        current = DeltaTable(str(self.state)).version()
        problem = None
        if mark.topic_id and self.topic_id and mark.topic_id != self.topic_id:
            problem = f"was deleted and recreated (topic id {mark.topic_id}, now {self.topic_id})"
        elif mark.table_id and mark.table_id != self.table_id:
            problem = (
                f"holds the versions of another state table (id {mark.table_id}; "
                f"{self.state} is {self.table_id})"
            )
        elif mark.records:
            marks = kafka_admin.watermarks(
                self.config, [(topic, p) for p in range(self.partitions)]
            )
            if all(high == 0 for _low, high in marks.values()):
                problem = f"is empty, but {mark.records} record(s) were published to it"
        if problem is None and mark.next_version > current + 1:
            problem = (
                f"holds state versions up to {mark.next_version - 1}, but the state table "
                f"is only at version {current}: the table was replaced"
            )
        if problem is None and mark.partitions and mark.partitions != self.partitions:
            raise OutputError(
                f"output topic {topic!r} has {self.partitions} partitions, but {app} spread "
                f"its keys over {mark.partitions}: a key's new records would land in another "
                f"partition than its old ones; repair: recreate the topic with "
                f"{mark.partitions} partitions, or recreate it with the new count and run "
                f"python -m jobs publish --pipeline {app} --snapshot --reason ..."
            )
        if problem is not None:
            raise OutputError(f"output topic {topic!r} {problem}; {repair(app)}")

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
        infos = self._read(lambda: commit_infos(self.state, first, current), first, current)
        published = []
        for version in range(first, current + 1):
            changes = self._read(
                functools.partial(net_changes, self.resolved, self.state, version, infos[version]),
                version,
                current,
            )
            if changes.num_records or version == current:
                # An empty version needs no transaction of its own: the next one's
                # bookmark moves past it, and the newest always gets one.
                published.append(self._transaction(changes))
        return [p for p in published if p.records]

    def _read(self, read: Callable[[], T], first: int, last: int) -> T:
        try:
            return read()
        except ConsistencyError as exc:
            if "damaged" in str(exc):
                raise
            problem: Exception = exc
        except Exception as exc:  # delta-rs and Arrow raise their own types
            problem = exc
        raise OutputError(
            f"state versions {first}..{last} of {self.app} cannot be read for output topic "
            f"{self.output.topic!r} ({problem}); {repair(self.app)}"
        ) from problem

    def publish_snapshot(self) -> Published:
        return self._snapshot(DeltaTable(str(self.state)).version())

    def _snapshot(self, version: int) -> Published:
        epoch = current_epoch(self.layout)
        return self._transaction(snapshot(self.resolved, self.state, version, epoch))

    def _transaction(self, changes: VersionChanges, attempt: int = 1) -> Published:
        """``changes`` and the bookmark past them in one transaction. (Crash tests
        aim their faults at the batch whose changes these are.)"""
        producer = self.producer
        assert producer is not None and self.consumer is not None
        records = (self.bookmark.records or 0) if self.bookmark is not None else 0
        mark = Bookmark(
            changes.version + 1,
            topic_id=self.topic_id,
            table_id=self.table_id,
            partitions=self.partitions,
            records=records + changes.num_records,
        )
        started = time.monotonic()
        stage = "sending"
        try:
            producer.begin_transaction()
            self._produce(producer, changes)
            producer.flush(TIMEOUT_S)
            maybe_crash("during_output", changes.batch_id)
            group = self.consumer.consumer_group_metadata()
            bookmarked = [TopicPartition(self.output.topic, 0, mark.next_version, mark.metadata())]
            _bounded(lambda: producer.send_offsets_to_transaction(bookmarked, group, TIMEOUT_S))
            stage = "committing"
            producer.commit_transaction(TIMEOUT_S)
        except _Stuck:
            # librdkafka can wait for a group coordinator that moved to another node
            # past its own timeout (librdkafka issues 5456, 5511). A new producer
            # fences the stuck one, whose transaction the coordinator aborts; its
            # thread is left behind. The version is published again, once.
            log.warning(
                "%s: the transaction of state version %d did not answer in %.0f s; a new "
                "producer takes over",
                self.app,
                changes.version,
                TIMEOUT_S,
            )
            _ABANDONED.append(producer)
            self.producer = self._new_producer()
            if attempt >= STUCK_ATTEMPTS:
                raise OutputError(
                    f"could not publish state version {changes.version} of {self.app} to "
                    f"{self.output.topic!r}: Kafka's group coordinator did not answer "
                    f"{attempt} times (nothing of it is visible; the next run publishes it)"
                ) from None
            return self._transaction(changes, attempt + 1)
        except KafkaException as exc:
            self._failed(producer, exc, changes, stage)
        except BaseException:
            # Not Kafka's (an encoding error, an interrupt): nothing of it may stay
            # open holding back read_committed consumers.
            with contextlib.suppress(KafkaException):
                producer.abort_transaction(TIMEOUT_S)
            raise
        maybe_crash("after_output", changes.batch_id)
        self.bookmark = mark
        log.info(
            "%s: state version %d (%s, %s) published to %s: %d record(s) in %.2f s",
            self.app,
            changes.version,
            changes.kind,
            changes.operation,
            self.output.topic,
            changes.num_records,
            time.monotonic() - started,
        )
        return Published(changes.version, changes.kind, changes.num_records)

    def _produce(self, producer: Producer, changes: VersionChanges) -> None:
        record_headers = headers(self.app, changes)
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

    def _failed(
        self, producer: Producer, exc: KafkaException, changes: VersionChanges, stage: str
    ) -> None:
        error = exc.args[0] if exc.args else None
        app, topic, version = self.app, self.output.topic, changes.version
        if isinstance(error, KafkaError) and error.code() in FENCED_CODES:
            raise FencedError(
                f"another publisher of {app} took over output topic {topic!r} (transactional "
                f"id {transactional_id(app)}); this one stops, state version {version} is "
                "left to it"
            ) from exc
        if stage == "committing" and not (
            isinstance(error, KafkaError) and error.txn_requires_abort()
        ):
            raise OutputError(
                f"the commit of state version {version} of {app} to {topic!r} did not "
                f"answer ({exc}): whether it is in the topic is unknown until the next "
                "publisher reads the bookmark (it publishes it then if it is not)"
            ) from exc
        with contextlib.suppress(KafkaException):  # else the next init_transactions does
            producer.abort_transaction(TIMEOUT_S)
        raise OutputError(
            f"could not publish state version {version} of {app} to {topic!r} (nothing of "
            f"it is visible; the next run publishes it): {exc}"
        ) from exc


# Producers left with a call in flight stay referenced for the life of the
# process: destroying one while librdkafka still serves its call aborts the process.
_ABANDONED: list[Producer] = []


class _Stuck(Exception):
    """A librdkafka call did not return within its own timeout."""


def _bounded(call: Callable[[], object]) -> None:
    """``call`` (given ``TIMEOUT_S`` itself), or ``_Stuck`` if it has not returned a
    few seconds after that: it runs in a daemon thread that may be left behind."""
    done = threading.Event()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # raised in the caller's thread
            failed.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, name="output-transaction", daemon=True).start()
    if not done.wait(TIMEOUT_S + STUCK_GRACE_S):
        raise _Stuck()
    if failed:
        raise failed[0]


@contextlib.contextmanager
def opened_publisher(
    resolved: Resolved, layout: AppLayout, config: dict[str, Any]
) -> Iterator[OutputPublisher | None]:
    """A run's publisher, when the pipeline has an output topic: open (older
    publishers fenced), every version not yet in the topic published, closed at the
    end. Without an output topic: None."""
    if resolved.pipeline.output is None:
        yield None
        return
    with OutputPublisher(resolved, layout, config) as publisher:
        publisher.publish_pending()
        yield publisher
