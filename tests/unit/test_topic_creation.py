"""A created topic is waited for until metadata reads agree it is served: on a
replicated cluster each broker applies the controller's record on its own, and a
read that lands on a broker behind it says the topic does not exist."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jobs import kafka_admin


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


class LaggingCluster:
    """Stands in for an AdminClient whose reads land on brokers in turn; broker 2
    applies the new topic ``lag`` reads after the others."""

    def __init__(self, lag: int) -> None:
        self.lag = lag
        self.reads = 0
        self.created = False

    def create_topics(self, topics: list[Any]) -> dict[str, Any]:
        self.created = True
        return {}

    def list_topics(self, topic: str | None = None, timeout: float = 0) -> Metadata:
        self.reads += 1
        behind = self.reads % 3 == 2 and self.reads <= self.lag
        topics = {} if behind else {"t": Topic({0: Partition(), 1: Partition()})}
        return Metadata(topics)


def test_creation_waits_until_every_read_serves_the_topic() -> None:
    cluster = LaggingCluster(lag=8)
    kafka_admin.create_topic(cluster, "t", 2)  # type: ignore[arg-type]
    assert cluster.created
    # The reads after creation include one per broker in a row that all served it,
    # so the one that follows (the caller's own) cannot land on the lagging broker.
    assert cluster.reads > 8
    assert kafka_admin.topic_partitions(cluster, ["t"]) == {"t": [0, 1]}  # type: ignore[arg-type]
