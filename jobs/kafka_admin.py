"""Small confluent-kafka helpers shared by the source, the CLI and the tools:
client configuration, topic creation, watermarks and bulk producing."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from jobs import kafka_settings
from jobs.errors import KafkaUnavailableError, SourceError

REQUEST_TIMEOUT_S = 10.0
# A cluster that did not answer (librdkafka's own codes), or answered "not now"
# while a leader or coordinator moves (codes Kafka's Java client retries).
# confluent-kafka marks errors retriable only in transactions, so these decide.
UNANSWERED_CODES = {
    KafkaError._TIMED_OUT,
    KafkaError._TRANSPORT,
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError._WAIT_COORD,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.REQUEST_TIMED_OUT,
    KafkaError.NETWORK_EXCEPTION,
    KafkaError.OFFSET_NOT_AVAILABLE,
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.NOT_ENOUGH_REPLICAS,
}
# What a broker answers for a topic it does not have.
NO_TOPIC_CODES = {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC}
LAG_TIMEOUT_S = 2.0  # per request of a metric's lag (see consumer_lag)


# librdkafka logs every failed connection attempt to stderr; the platform reports
# failures itself, in one line. The client logs stay available to a configured
# "jobs.kafka_client" logger.
CLIENT_LOG = logging.getLogger("jobs.kafka_client")
CLIENT_LOG.addHandler(logging.NullHandler())
CLIENT_LOG.propagate = False


def read_error(message: Message, topic: str, partition: int) -> KafkaError | None:
    """The error of a consumed event that stops reading ``topic[partition]``: one
    about that partition (out of range, authorization, ...) or a fatal one. Client
    level events (a coordinator lookup or a connection that failed and is retried)
    are logged and passed over: librdkafka retries them, and a read that makes no
    progress for long is stopped by its own timeout."""
    error = message.error()
    if error is None or error.code() == KafkaError._PARTITION_EOF:
        return None
    if error.fatal() or (message.topic() == topic and message.partition() == partition):
        return error
    CLIENT_LOG.warning("reading %s[%d]: transient client error %s", topic, partition, error)
    return None


_refused_logins: list[str] = []


def _on_client_error(error: KafkaError) -> None:
    """librdkafka's error callback: a refused login surfaces to the caller only as a
    timeout; it is kept so that the command's error line can say why."""
    if error.code() == KafkaError._AUTHENTICATION:
        _refused_logins[:] = [error.str()]
    CLIENT_LOG.warning("Kafka client error: %s", error)


def _code(exc: KafkaException) -> int | None:
    error = exc.args[0] if exc.args else None
    return error.code() if isinstance(error, KafkaError) else None


def kafka_error(what: str, exc: KafkaException) -> SourceError:
    """``what`` failed with ``exc``: a ``KafkaUnavailableError`` when the cluster did
    not answer or answered "not now" (``UNANSWERED_CODES``, or an error the client
    marks retriable)."""
    error = exc.args[0] if exc.args else None
    retriable = isinstance(error, KafkaError) and (
        error.retriable() or error.code() in UNANSWERED_CODES
    )
    kind = KafkaUnavailableError if retriable else SourceError
    return kind(f"{what}: {exc}")


def serve_callbacks(client: AdminClient | Consumer | Producer) -> None:
    """Serve the client's queued callbacks (errors, logs) before reporting a failed
    request (an admin client or producer: a consumer's poll would consume)."""
    if not isinstance(client, Consumer):
        client.poll(0)


def login_refused() -> str | None:
    """The end of an error line when a broker refused this process's Kafka login
    (consumed: a later error of a long-lived process is not blamed on it)."""
    if not _refused_logins:
        return None
    refused = _refused_logins.pop()
    return (
        f" (the broker refused the Kafka login: {refused[:200]}; check "
        "PLATFORM_KAFKA_SECURITY_PROTOCOL, _SASL_MECHANISM, _SASL_USERNAME, _SASL_PASSWORD)"
    )


def client_config(bootstrap_servers: str, extra: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Client settings: bootstrap servers plus pass-through settings (security included)."""
    config: dict[str, Any] = kafka_settings.for_librdkafka(extra or {})
    config["bootstrap.servers"] = bootstrap_servers
    config.setdefault("logger", CLIENT_LOG)
    config.setdefault("error_cb", _on_client_error)
    return config


def admin(config: Mapping[str, str]) -> AdminClient:
    return AdminClient(dict(config))


def topic_partitions(
    client: AdminClient | Consumer, topics: Iterable[str], servers: str = "the configured servers"
) -> dict[str, list[int]]:
    """Partitions per topic; a missing topic or unreachable broker is a SourceError."""
    wanted = list(topics)
    try:
        metadata = client.list_topics(timeout=REQUEST_TIMEOUT_S)
    except KafkaException as exc:
        serve_callbacks(client)
        raise kafka_error(f"cannot reach the Kafka broker at {servers}", exc) from exc
    result: dict[str, list[int]] = {}
    for topic in wanted:
        meta = metadata.topics.get(topic)
        error = meta.error if meta is not None else None
        if error is not None and error.code() not in NO_TOPIC_CODES:
            # refused (authorization), or no leader yet: not a missing topic
            raise kafka_error(f"cannot read the metadata of topic {topic!r}", KafkaException(error))
        if meta is None or error is not None or not meta.partitions:
            raise SourceError(f"topic {topic!r} does not exist on the broker")
        result[topic] = sorted(meta.partitions)
    return result


# What a broker without topic ids (Kafka before 2.8) answers.
NO_TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAA"


def topic_ids(client: AdminClient, topics: Iterable[str]) -> dict[str, str]:
    """The broker's id of each topic, which changes when a topic is deleted and
    recreated under the same name; topics whose id the broker does not report are
    left out (the offset checks still catch a recreated topic that is shorter)."""
    wanted = list(topics)
    try:
        return _described_ids(client, wanted)
    except KafkaException as exc:
        serve_callbacks(client)
        raise kafka_error(f"cannot describe topics {wanted}", exc) from exc


def _described_ids(client: AdminClient, topics: list[str]) -> dict[str, str]:
    futures = client.describe_topics(TopicCollection(topics), request_timeout=REQUEST_TIMEOUT_S)
    found = {topic: str(future.result().topic_id) for topic, future in futures.items()}
    return {t: i for t, i in found.items() if i and i != NO_TOPIC_ID and set(i) != {"A"}}


@dataclass(frozen=True)
class ServedTopic:
    """A created topic as the brokers serve it: its partitions and its id (None from
    a broker that reports none)."""

    partitions: list[int]
    topic_id: str | None


def create_topic(
    client: AdminClient,
    topic: str,
    partitions: int,
    config: Mapping[str, str] | None = None,
) -> ServedTopic:
    """Create a topic; an existing one is left as it is. Its replication factor and
    ``min.insync.replicas`` are the cluster's defaults (3 and 2 on a replicated
    cluster: ``jobs/broker.py``, docker-compose.yml; 1 on the single embedded node).
    Returns the topic as the wait read it: a caller that reads it again may ask a
    broker that is still behind."""
    new = NewTopic(topic, partitions, replication_factor=-1, config=dict(config or {}))
    futures = client.create_topics([new])
    for future in futures.values():
        try:
            future.result()
        except KafkaException as exc:
            if _code(exc) != KafkaError.TOPIC_ALREADY_EXISTS:
                raise kafka_error(f"cannot create topic {topic!r}", exc) from exc
    return _await_served(client, topic)


def _await_served(client: AdminClient, topic: str) -> ServedTopic:
    """Wait until reads agree that the topic is served with a leader for every
    partition and has an id. CreateTopics returns once the controller committed the
    topic; each broker applies it a moment later (KRaft propagates metadata
    asynchronously), and a request that lands on a broker behind says the topic
    does not exist. The client picks the broker of each request, so the wait asks
    for twice as many good reads in a row as there are brokers; it cannot prove that
    every broker is there, which is why the caller keeps what it returns."""
    deadline = time.monotonic() + REQUEST_TIMEOUT_S
    in_a_row = 0
    while True:
        served = _served(client, topic)
        if served is not None:
            in_a_row += 1
            if in_a_row >= 2 * max(1, served[1]):
                return served[0]
            continue
        in_a_row = 0
        if time.monotonic() > deadline:
            raise SourceError(f"topic {topic!r} was created but the broker does not serve it yet")
        time.sleep(0.05)


def _served(client: AdminClient, topic: str) -> tuple[ServedTopic, int] | None:
    """The topic and the number of brokers, as one broker serves them; None from a
    broker that has not applied the topic yet."""
    try:
        metadata = client.list_topics(topic=topic, timeout=REQUEST_TIMEOUT_S)
    except KafkaException as exc:
        serve_callbacks(client)
        raise kafka_error(f"cannot read the metadata of topic {topic!r}", exc) from exc
    meta = metadata.topics.get(topic)
    partitions = meta.partitions if meta is not None and meta.error is None else {}
    if not partitions or any(p.leader < 0 for p in partitions.values()):
        return None
    try:
        topic_id = _described_ids(client, [topic]).get(topic)
    except KafkaException as exc:
        failed = kafka_error(f"cannot describe topic {topic!r}", exc)
        if _code(exc) in NO_TOPIC_CODES or isinstance(failed, KafkaUnavailableError):
            return None  # not there yet: the wait asks again until its deadline
        serve_callbacks(client)
        raise failed from exc
    return ServedTopic(sorted(partitions), topic_id), len(metadata.brokers)


def produce_all(
    config: Mapping[str, str],
    topic: str,
    records: Iterable[tuple[bytes | None, bytes, int | None]],
) -> int:
    """Produce (key, value, timestamp_ms) records idempotently and wait for all acks."""
    producer = Producer(
        {
            **config,
            "enable.idempotence": True,
            "acks": "all",  # every in-sync replica has it (idempotence needs it too)
            "linger.ms": 20,
            "batch.num.messages": 10000,
            "queue.buffering.max.messages": 200000,
        }
    )
    failures: list[str] = []

    def on_delivery(err: object, _msg: object) -> None:
        if err is not None:
            failures.append(str(err))

    count = 0
    for key, value, timestamp_ms in records:
        while True:
            try:
                producer.produce(
                    topic,
                    value=value,
                    key=key,
                    timestamp=timestamp_ms or 0,
                    on_delivery=on_delivery,
                )
                break
            except BufferError:
                producer.poll(0.05)
        count += 1
        if count % 10000 == 0:
            producer.poll(0)
    remaining = producer.flush(60)
    if remaining or failures:
        raise SourceError(f"{remaining} records not acknowledged, errors: {failures[:3]}")
    return count


def partition_watermarks(
    consumer: Consumer,
    partitions: Iterable[tuple[str, int]],
    timeout_s: float = REQUEST_TIMEOUT_S,
) -> dict[tuple[str, int], tuple[int, int]]:
    """(low, high) watermark per topic-partition, asked of the broker without consuming."""
    result = {}
    for topic, partition in partitions:
        try:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=timeout_s
            )
        except KafkaException as exc:
            raise kafka_error(f"cannot read offsets of {topic}[{partition}]", exc) from exc
        result[(topic, partition)] = (int(low), int(high))
    return result


def watermarks(
    consumer_config: Mapping[str, str],
    partitions: Iterable[tuple[str, int]],
    timeout_s: float = REQUEST_TIMEOUT_S,
) -> dict[tuple[str, int], tuple[int, int]]:
    consumer = Consumer({**consumer_config, "group.id": "platform-watermarks"})
    try:
        return partition_watermarks(consumer, partitions, timeout_s)
    finally:
        consumer.close()


@dataclass(frozen=True)
class TopicsNow:
    """What the brokers say of a pipeline's topics, asked once at a run's start:
    each topic's partitions, its id (``topic_ids``) and each partition's (low, high)
    watermarks."""

    partitions: dict[str, list[int]]
    ids: dict[str, str]
    marks: dict[tuple[str, int], tuple[int, int]]


def topics_now(config: Mapping[str, str], topics: Iterable[str], servers: str) -> TopicsNow:
    wanted = list(topics)
    client = admin(config)
    partitions = topic_partitions(client, wanted, servers)
    ids = topic_ids(client, wanted)
    marks = watermarks(config, [(t, p) for t, parts in partitions.items() for p in parts])
    return TopicsNow(partitions, ids, marks)


def consumer_lag(
    consumer_config: Mapping[str, str], positions: Mapping[str, Mapping[str, int]]
) -> dict[tuple[str, int], int]:
    """Records after ``positions`` (topic -> partition -> next offset, the offset
    log's shape) in each topic-partition, from the broker's high watermarks. The
    first partition that does not answer in 2 s fails it: a scrape must finish
    within Prometheus's timeout (10 s) even with the broker down."""
    partitions = [(topic, int(p)) for topic, parts in positions.items() for p in parts]
    marks = watermarks(consumer_config, partitions, LAG_TIMEOUT_S)
    return {
        (topic, partition): max(0, high - int(positions[topic][str(partition)]))
        for (topic, partition), (_low, high) in marks.items()
    }
