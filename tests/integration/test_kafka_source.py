"""Spark's own Kafka source, with the options every platform read uses
(``jobs/kafka_source/spark_kafka.py``), against the real embedded broker: the
facts about it the platform relies on."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import NewPartitions

from jobs import kafka_admin
from jobs.errors import SourceError
from jobs.kafka_source import spark_kafka
from tests.conftest import produce

pytestmark = pytest.mark.integration


def run_stream(
    spark, servers: str, topic: str, tmp: Path, checkpoint: Path | None = None, **options: str
) -> list[list[dict[str, Any]]]:  # type: ignore[no-untyped-def]
    """Runs an availableNow query and returns the rows of each micro-batch."""
    batches: list[list[dict[str, Any]]] = []
    reader = spark.readStream.format(spark_kafka.FORMAT)
    for key, value in spark_kafka.source_options(servers, {}).items():
        reader = reader.option(key, value)
    reader = reader.option("subscribe", topic).option("startingOffsets", "earliest")
    for key, value in options.items():
        reader = reader.option(key, value)

    def collect(batch, _batch_id: int) -> None:  # type: ignore[no-untyped-def]
        batches.append([row.asDict(recursive=True) for row in batch.collect()])

    query = (
        reader.load()
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint or tmp / f"ck-{uuid.uuid4().hex}"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    exc = query.exception()
    if exc is not None:
        raise RuntimeError(str(exc))
    return batches


def test_exact_records_and_columns(spark, broker, kafka_config, new_topic, tmp_path) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(2)
    producer = Producer(kafka_config)
    for i in range(10):
        producer.produce(
            topic, key=b"k%d" % i, value=b"v%d" % i, partition=i % 2, headers=[("h", b"x")]
        )
    producer.flush(10)
    batches = run_stream(spark, broker.bootstrap_servers, topic, tmp_path, includeHeaders="true")
    rows = [r for b in batches for r in b]
    assert sorted((r["partition"], r["offset"], r["key"], r["value"]) for r in rows) == sorted(
        (i % 2, i // 2, b"k%d" % i, b"v%d" % i) for i in range(10)
    )
    assert {r["topic"] for r in rows} == {topic}
    assert all(r["timestampType"] == 0 for r in rows)  # CreateTime, as in Spark
    assert all(r["headers"] == [{"key": "h", "value": b"x"}] for r in rows)
    assert abs(rows[0]["timestamp"].timestamp() - time.time()) < 300


def test_max_offsets_per_trigger_and_available_now(
    spark, broker, kafka_config, new_topic, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(4)
    produce(kafka_config, topic, [b"%d" % i for i in range(1000)])
    batches = run_stream(
        spark, broker.bootstrap_servers, topic, tmp_path, maxOffsetsPerTrigger="300"
    )
    # Spark shares the limit out over the partitions, rounding down.
    assert all(len(b) <= 300 for b in batches) and len(batches) >= 4
    offsets = [(r["partition"], r["offset"]) for b in batches for r in b]
    assert len(offsets) == len(set(offsets)) == 1000


def test_restart_resumes_and_picks_up_new_partitions(
    spark, broker, kafka_config, new_topic, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(1)
    checkpoint = tmp_path / "ck"
    produce(kafka_config, topic, [b"a%d" % i for i in range(5)])
    first = run_stream(spark, broker.bootstrap_servers, topic, tmp_path, checkpoint)
    assert sum(len(b) for b in first) == 5
    admin = kafka_admin.admin(kafka_config)
    for future in admin.create_partitions([NewPartitions(topic, 2)]).values():
        future.result()
    producer = Producer(kafka_config)
    for i in range(6):
        producer.produce(topic, value=b"b%d" % i, partition=i % 2)
    producer.flush(10)
    # The new partition is discovered; its records are read on the next run.
    second = run_stream(spark, broker.bootstrap_servers, topic, tmp_path, checkpoint)
    third = run_stream(spark, broker.bootstrap_servers, topic, tmp_path, checkpoint)
    later = sorted(r["value"] for b in second + third for r in b)
    assert later == sorted(b"b%d" % i for i in range(6))


def test_transactional_input_is_read_committed(
    spark, broker, kafka_config, new_topic, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(1)
    producer = Producer({**kafka_config, "transactional.id": f"src-{topic}"})
    producer.init_transactions(10)
    for i, commit in enumerate([True, False, True]):
        producer.begin_transaction()
        producer.produce(topic, value=b"r%d" % i)
        if commit:
            producer.commit_transaction(10)
        else:
            producer.abort_transaction(10)
    # The range ends on a commit marker that is never delivered: the read must end.
    batches = run_stream(spark, broker.bootstrap_servers, topic, tmp_path)
    assert sorted(r["value"] for b in batches for r in b) == [b"r0", b"r2"]


def test_starting_offsets_json_and_timestamp(
    spark, broker, kafka_config, new_topic, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(1)
    base = int(time.time() * 1000) - 100_000
    kafka_admin.produce_all(
        kafka_config, topic, ((None, b"%d" % i, base + i * 1000) for i in range(10))
    )
    spec = json.dumps({topic: {"0": 7}})
    batches = run_stream(spark, broker.bootstrap_servers, topic, tmp_path, startingOffsets=spec)
    assert [r["value"] for b in batches for r in b] == [b"7", b"8", b"9"]
    batches = run_stream(
        spark, broker.bootstrap_servers, topic, tmp_path, startingTimestamp=str(base + 5500)
    )
    assert [r["value"] for b in batches for r in b] == [b"6", b"7", b"8", b"9"]


def test_missing_topic_is_a_clear_error(broker) -> None:  # type: ignore[no-untyped-def]
    """Spark's source would wait for a missing topic: the platform asks first."""
    config = kafka_admin.client_config(broker.bootstrap_servers)
    with pytest.raises(SourceError, match="topic 'no_such_topic' does not exist"):
        kafka_admin.topic_partitions(
            kafka_admin.admin(config), ["no_such_topic"], broker.bootstrap_servers
        )


def test_unreachable_broker_is_a_clear_error() -> None:
    from jobs.local_server import find_free_port

    servers = f"127.0.0.1:{find_free_port(14000, 15000)}"
    config = kafka_admin.client_config(servers, {"socket.timeout.ms": "2000"})
    with pytest.raises(SourceError, match="cannot reach the Kafka broker"):
        kafka_admin.topic_partitions(kafka_admin.admin(config), ["x"], servers)


def test_offsets_below_log_start_are_an_error(
    spark, broker, kafka_config, new_topic, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(1)
    produce(kafka_config, topic, [b"%d" % i for i in range(10)])
    checkpoint = tmp_path / "ck"
    run_stream(
        spark, broker.bootstrap_servers, topic, tmp_path, checkpoint, maxOffsetsPerTrigger="3"
    )
    # Process only part, then lose records the query has not read yet.
    spec = json.dumps({topic: {"0": 0}})
    admin = kafka_admin.admin(kafka_config)
    for future in admin.delete_records([TopicPartition(topic, 0, 6)]).values():
        future.result()
    with pytest.raises(Exception, match=r"(?i)data may have been lost|out of range|fetch offset"):
        run_stream(spark, broker.bootstrap_servers, topic, tmp_path, startingOffsets=spec)
