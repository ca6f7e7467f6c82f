"""The embedded broker is a reimplementation of Kafka: check exactly the features
the platform relies on, so a broker upgrade that breaks one fails here first."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from jobs import broker as embedded
from jobs import kafka_admin
from jobs.broker import BrokerInfo
from jobs.errors import BrokerError
from tests.conftest import produce


def consume_all(config: dict[str, str], topic: str, partition: int, isolation: str) -> list[bytes]:
    consumer = Consumer(
        {
            **config,
            "group.id": "conformance",
            "isolation.level": isolation,
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, partition, 0)])
    _low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
    values: list[bytes] = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        for msg in consumer.consume(1000, 0.2):
            if msg.error() is None:
                values.append(msg.value())
        if consumer.position([TopicPartition(topic, partition)])[0].offset >= high:
            break
    consumer.close()
    return values


def test_topics_partitions_and_watermarks(kafka_config: dict[str, str], new_topic) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(3)
    parts = kafka_admin.topic_partitions(kafka_admin.admin(kafka_config), [topic])
    assert parts == {topic: [0, 1, 2]}
    producer = Producer({**kafka_config, "enable.idempotence": True})
    for i in range(30):
        producer.produce(topic, value=b"%d" % i, partition=i % 3)
    assert producer.flush(10) == 0
    marks = kafka_admin.watermarks(kafka_config, [(topic, p) for p in range(3)])
    assert marks == {(topic, p): (0, 10) for p in range(3)}


def test_offsets_for_times(kafka_config: dict[str, str], new_topic) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(1)
    base = int(time.time() * 1000) - 60_000
    kafka_admin.produce_all(kafka_config, topic, ((None, b"x", base + i * 1000) for i in range(10)))
    consumer = Consumer({**kafka_config, "group.id": "conformance"})
    found = consumer.offsets_for_times([TopicPartition(topic, 0, base + 4500)], timeout=10)
    consumer.close()
    assert found[0].offset == 5


def test_transactions_read_committed_hides_aborted(kafka_config: dict[str, str], new_topic) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(1)
    producer = Producer({**kafka_config, "transactional.id": f"conf-{topic}"})
    producer.init_transactions(10)
    producer.begin_transaction()
    producer.produce(topic, value=b"committed-1")
    producer.commit_transaction(10)
    producer.begin_transaction()
    producer.produce(topic, value=b"aborted")
    producer.abort_transaction(10)
    producer.begin_transaction()
    producer.produce(topic, value=b"committed-2")
    producer.commit_transaction(10)
    assert consume_all(kafka_config, topic, 0, "read_committed") == [b"committed-1", b"committed-2"]


def test_offsets_committed_in_a_transaction_and_zombie_fencing(  # type: ignore[no-untyped-def]
    kafka_config: dict[str, str], new_topic
) -> None:
    """What an exactly-once output topic relies on (as Kafka Streams does): a
    position committed atomically with the records, and an older producer of the
    same transactional.id fenced by a newer one."""
    from confluent_kafka import KafkaException

    topic = new_topic(1)
    group = Consumer({**kafka_config, "group.id": f"out-{topic}", "enable.auto.commit": False})
    producer = Producer({**kafka_config, "transactional.id": f"out-{topic}"})
    producer.init_transactions(10)
    for position in (5, 6):
        producer.begin_transaction()
        producer.produce(topic, value=b"v%d" % position)
        producer.send_offsets_to_transaction(
            [TopicPartition(topic, 0, position + 1)], group.consumer_group_metadata(), 10
        )
        producer.commit_transaction(10)
    newer = Producer({**kafka_config, "transactional.id": f"out-{topic}"})
    newer.init_transactions(10)
    with pytest.raises(KafkaException):
        producer.begin_transaction()
        producer.produce(topic, value=b"zombie")
        producer.commit_transaction(10)
    assert group.committed([TopicPartition(topic, 0)], 10)[0].offset == 7
    group.close()
    assert consume_all(kafka_config, topic, 0, "read_committed") == [b"v5", b"v6"]


def test_delete_records_moves_the_log_start(kafka_config: dict[str, str], new_topic) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(1)
    produce(kafka_config, topic, [b"%d" % i for i in range(10)])
    admin = kafka_admin.admin(kafka_config)
    futures = admin.delete_records([TopicPartition(topic, 0, 4)])
    for future in futures.values():
        future.result()
    assert kafka_admin.watermarks(kafka_config, [(topic, 0)])[(topic, 0)] == (4, 10)


def test_restart_keeps_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # One id in 64 starts with "-" (URL-safe base64), which the format tool took
    # for an option: a fresh data dir then failed to start.
    dashed = "-AAAAAAAAAAAAAAAAAAAAA"  # 16 bytes, the first 0xf8
    monkeypatch.setattr(embedded, "_cluster_id", lambda: dashed)
    port = embedded.find_free_port()
    info = embedded.start(tmp_path, port)
    meta = (tmp_path / embedded.LOG_DIR / "meta.properties").read_text()
    assert f"cluster.id={dashed}" in meta.splitlines()
    config = kafka_admin.client_config(info.bootstrap_servers)
    kafka_admin.create_topic(kafka_admin.admin(config), "kept", 1)
    produce(config, "kept", [b"a", b"b", b"c"])
    time.sleep(3)  # it persists a few seconds behind (measured)
    assert embedded.stop(tmp_path)
    info = embedded.start(tmp_path, port)
    try:
        assert consume_all(config, "kept", 0, "read_committed") == [b"a", b"b", b"c"]
    finally:
        embedded.stop(tmp_path)


def test_a_controller_port_taken_before_its_bind_is_chosen_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Free when chosen, then taken by another process (parallel test workers): the
    # first launch fails to bind it, and the node starts on another.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        choose = embedded.find_free_port
        picks = iter([busy])
        monkeypatch.setattr(
            embedded, "find_free_port", lambda *a, **k: next(picks, None) or choose(*a, **k)
        )
        info = embedded.start(tmp_path, choose())
        try:
            state = json.loads((tmp_path / embedded.STATE_FILE).read_text())
            assert state["controller_port"] != busy
            assert f"failed to bind to 127.0.0.1:{busy}" in (tmp_path / "broker.log").read_text()
            config = kafka_admin.client_config(info.bootstrap_servers)
            kafka_admin.create_topic(kafka_admin.admin(config), "after_a_retry", 1)
        finally:
            embedded.stop(tmp_path)


def test_port_taken_is_a_clear_error(broker: BrokerInfo, tmp_path: Path) -> None:
    with pytest.raises(BrokerError, match=f"port {broker.port} on 127.0.0.1 is already in use"):
        embedded.start(tmp_path, broker.port)
