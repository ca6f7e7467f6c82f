"""Which consumer events stop a read: the partition's own errors and fatal ones;
client-level events that librdkafka retries (a coordinator lookup) do not."""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka import KafkaError

from jobs.kafka_admin import read_error


@dataclass
class Event:
    """Stands in for a consumed ``confluent_kafka.Message`` carrying an error."""

    err: KafkaError | None
    where: tuple[str | None, int | None]

    def error(self) -> KafkaError | None:
        return self.err

    def topic(self) -> str | None:
        return self.where[0]

    def partition(self) -> int | None:
        return self.where[1]


def test_partition_errors_stop_the_read_and_client_events_do_not() -> None:
    out_of_range = KafkaError(KafkaError._AUTO_OFFSET_RESET)
    assert read_error(Event(out_of_range, ("t", 0)), "t", 0) is out_of_range  # type: ignore[arg-type]
    coordinator = KafkaError(KafkaError._BAD_MSG, "FindCoordinator response error")
    assert read_error(Event(coordinator, (None, -1)), "t", 0) is None  # type: ignore[arg-type]
    fatal = KafkaError(KafkaError._FATAL, "fenced", fatal=True)
    assert read_error(Event(fatal, (None, -1)), "t", 0) is fatal  # type: ignore[arg-type]
    eof = KafkaError(KafkaError._PARTITION_EOF)
    assert read_error(Event(eof, ("t", 0)), "t", 0) is None  # type: ignore[arg-type]
    assert read_error(Event(None, ("t", 0)), "t", 0) is None  # type: ignore[arg-type]


def test_a_changed_topic_id_is_a_recreated_topic_and_unknown_ids_are_not_compared() -> None:
    import pytest

    from jobs.cut import check_same_topics
    from jobs.errors import SourceError

    check_same_topics({"a": "id1", "b": "id2"}, {"a": "id1", "b": "id2"})
    check_same_topics({"a": "id1"}, {})  # the broker reports no ids now: offset checks only
    check_same_topics({}, {"a": "id1"})  # a cut from before ids were recorded
    with pytest.raises(SourceError, match=r"'b' was deleted and recreated.*--mode skip"):
        check_same_topics({"a": "id1", "b": "id2"}, {"a": "id1", "b": "id9"})
