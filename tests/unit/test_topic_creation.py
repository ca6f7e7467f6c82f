"""A created topic is waited for until metadata reads agree it is served: on a
replicated cluster each broker applies the controller's record on its own, and a
read that lands on a broker behind it says the topic does not exist."""

from __future__ import annotations

from collections.abc import Container
from concurrent.futures import Future
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from jobs import kafka_admin
from jobs.output import publisher


@dataclass
class Partition:
    leader: int = 1


@dataclass
class Topic:
    partitions: dict[int, Partition]
    error: object = None


@dataclass
class Metadata:
    topics: dict[str, Topic]
    brokers: dict[int, object] = field(default_factory=lambda: {1: 0, 2: 0, 3: 0})


class Cluster:
    """Stands in for an AdminClient: librdkafka sends each request to any broker
    that is up. Requests ``behind`` (counted from 1, list and describe alike) land
    on a broker that has not applied the new topic yet."""

    def __init__(self, behind: Container[int]) -> None:
        self.behind = behind
        self.requests = 0
        self.created = False

    def _serves(self) -> bool:
        self.requests += 1
        return self.created and self.requests not in self.behind

    def create_topics(self, topics: list[Any]) -> dict[str, Any]:
        self.created = True
        return {}

    def list_topics(self, topic: str | None = None, timeout: float = 0) -> Metadata:
        served = self._serves()
        return Metadata({"t": Topic({0: Partition(), 1: Partition()})} if served else {})

    def describe_topics(self, topics: Any, request_timeout: float = 0) -> dict[str, Any]:
        if not self._serves():
            raise KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
        done: Future[Any] = Future()
        done.set_result(SimpleNamespace(topic_id="NjNmYzA4ZTEtYjQxMC00Zg"))
        return {"t": done}


def test_creation_waits_until_reads_in_a_row_serve_the_topic() -> None:
    # Every third request lands on a broker that is behind, up to the eighth.
    cluster = Cluster(behind={2, 5, 8})
    created = kafka_admin.create_topic(cluster, "t", 2)  # type: ignore[arg-type]
    assert cluster.created
    assert created == kafka_admin.ServedTopic([0, 1], "NjNmYzA4ZTEtYjQxMC00Zg")
    # Three brokers: six reads in a row (a list and a describe each) after the last miss.
    assert cluster.requests == 8 + 6 * 2


def test_the_publisher_keeps_what_the_wait_read_of_the_topic_it_created(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Requests stick to one broker, then move to one behind. The first read (before
    # creation) finds nothing; where the wait's reads are served, the next three
    # land on the broker behind. A publisher that read the topic
    # again after the wait stopped with "topic 't' does not exist on the broker".
    for behind in (range(8, 11), range(9, 12), range(3, 6)):
        cluster = Cluster(behind)
        monkeypatch.setattr(kafka_admin, "admin", lambda config, cluster=cluster: cluster)
        output = publisher.OutputPublisher.__new__(publisher.OutputPublisher)
        output.config = {}
        output.output = SimpleNamespace(topic="t", partitions=2)  # type: ignore[assignment]
        output._ensure_topic()
        assert cluster.created
        assert (output.partitions, output.topic_id) == (2, "NjNmYzA4ZTEtYjQxMC00Zg")
