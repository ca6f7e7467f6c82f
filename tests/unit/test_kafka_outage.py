"""A Kafka cluster that stops answering under a run: Spark's failure is the
platform's ``KafkaUnavailableError`` (one line, exit 2), and a continuous run's
wait-and-restart budget (``outage.py``) follows a plain model of it."""

from __future__ import annotations

import threading

import pytest

from jobs.errors import EXIT_ERROR, KafkaUnavailableError, failure
from jobs.kafka_source.spark_kafka import data_loss_error, unavailable_error

# Spark 4.2's failure when the only broker stopped during a batch (a continuous run
# on the embedded broker, the broker stopped 5 s after the first batch).
TASK_TIMEOUT = (
    "[STREAM_FAILED] Query [id = 1c0e, runId = 5f2a] terminated with exception: "
    "[FOREACH_BATCH_USER_FUNCTION_ERROR] An error occurred in the user provided function "
    "in foreach batch sink. Reason: An exception was raised by the Python Proxy. Return "
    "Message: Traceback (most recent call last):\n"
    '  File "/venv/pyspark/sql/utils.py", line 163, in call\n'
    "    self.func(DataFrame(jdf, wrapped_session_jdf), batch_id)\n"
    "pyspark.errors.exceptions.captured.SparkException: Job aborted due to stage failure: "
    "Task 0 in stage 19.0 failed 1 times, most recent failure: Lost task 0.0 in stage 19.0 "
    "(TID 43) (localhost executor driver): org.apache.kafka.common.errors.TimeoutException: "
    "Timeout of 15000ms expired before the position for partition clicks-2 could be "
    "determined\n\tat org.apache.spark.sql.kafka010.consumer.KafkaDataConsumer.fetch\n"
)
# The driver's offset request, planning the next batch.
PLANNING_TIMEOUT = (
    "[STREAM_FAILED] Query [id = 1c0e, runId = 5f2a] terminated with exception: Timed out "
    "waiting for a node assignment. Call: listOffsets(api=LIST_OFFSETS)\n"
    "org.apache.kafka.common.errors.TimeoutException: Timed out waiting for a node "
    "assignment. Call: listOffsets(api=LIST_OFFSETS)\n"
)


@pytest.mark.parametrize(
    ("text", "detail"),
    [
        (TASK_TIMEOUT, "Timeout of 15000ms expired before the position for partition clicks-2"),
        (PLANNING_TIMEOUT, "Timed out waiting for a node assignment. Call: listOffsets"),
        (
            "org.apache.spark.SparkException: Job aborted due to stage failure: Task 1 in "
            "stage 7.0 failed 1 times, most recent failure: Lost task 1.0 in stage 7.0: "
            "java.util.concurrent.TimeoutException: Cannot fetch record for offset 812 in "
            "120000 milliseconds\n\tat org.apache.spark.sql.kafka010.consumer.Internal",
            "Cannot fetch record for offset 812 in 120000 milliseconds",
        ),
        (
            # The stopped broker's port answered by another process's Kafka controller
            # listener (CI, another test's node): it speaks Kafka but is no broker.
            "[STREAM_FAILED] Query [id = 2a26, runId = 2141] terminated with exception: "
            "org.apache.kafka.common.errors.UnsupportedVersionException: The node does not "
            "support METADATA SQLSTATE: XXKST",
            "UnsupportedVersionException: The node does not support METADATA",
        ),
    ],
)
def test_a_kafka_timeout_in_sparks_failure_is_kafka_unavailable(text: str, detail: str) -> None:
    error = unavailable_error(RuntimeError(text))
    assert isinstance(error, KafkaUnavailableError)
    assert detail in str(error) and "\n" not in str(error)
    assert "nothing of the batch is committed" in str(error)
    code, line = failure(error)
    assert code == EXIT_ERROR and line == str(error)


def test_other_failures_are_not_kafka_unavailable() -> None:
    assert unavailable_error(RuntimeError("[DIVIDE_BY_ZERO] Division by zero.")) is None
    lost = (
        "Cannot fetch offset 5 (GroupId: x, TopicPartition: clicks-0). Some data may have "
        "been lost because they are not available in Kafka any more. failOnDataLoss ... "
        "org.apache.kafka.common.errors.TimeoutException: whatever"
    )
    # Records that are gone are a loss to repair, never a wait for the brokers.
    assert unavailable_error(RuntimeError(lost)) is None
    assert data_loss_error(RuntimeError(lost)) is not None


def test_the_wait_runs_from_the_outages_first_failure() -> None:
    from jobs.streaming.outage import OutageClock

    clock = OutageClock(300)
    assert clock.deadline(1000.0, progressed=False) == 1300.0
    # Failing again without a batch in between: the same outage, the same end.
    assert clock.deadline(1100.0, progressed=False) == 1300.0
    assert clock.deadline(1300.0, progressed=False) is None
    # A committed batch in between: a new outage.
    assert clock.deadline(1400.0, progressed=True) == 1700.0
    assert OutageClock(0).deadline(5.0, progressed=True) is None


def test_a_cluster_that_does_not_answer_is_unavailable_and_a_refusal_is_not() -> None:
    from confluent_kafka import KafkaError, KafkaException

    from jobs.errors import SourceError
    from jobs.kafka_admin import kafka_error

    down = kafka_error("cannot reach the Kafka broker", KafkaException(KafkaError(-195)))
    assert isinstance(down, KafkaUnavailableError) and not down.while_running
    denied = kafka_error("cannot describe", KafkaException(KafkaError(29)))  # authorization
    assert type(denied) is SourceError


@pytest.mark.parametrize(
    "code",
    [
        "REQUEST_TIMED_OUT",
        "OFFSET_NOT_AVAILABLE",  # a new leader whose high watermark has not caught up
        "NOT_COORDINATOR",
        "COORDINATOR_LOAD_IN_PROGRESS",
        "COORDINATOR_NOT_AVAILABLE",
        "NOT_ENOUGH_REPLICAS",
        "NETWORK_EXCEPTION",
    ],
)
def test_a_cluster_between_leaders_is_unavailable(code: str) -> None:
    """What a broker answers while a leader or coordinator moves; confluent-kafka's
    ``retriable()`` is False on these outside transactions, so the codes decide."""
    from confluent_kafka import KafkaError, KafkaException

    from jobs.kafka_admin import kafka_error

    error = kafka_error(
        "cannot read offsets of t[0]", KafkaException(KafkaError(getattr(KafkaError, code)))
    )
    assert isinstance(error, KafkaUnavailableError)


@pytest.mark.parametrize("raw", ["-1", "1.5", "5m", "604801", "²"])
def test_a_bad_outage_wait_is_refused(monkeypatch, raw: str) -> None:  # type: ignore[no-untyped-def]
    from jobs.errors import ConfigError
    from jobs.settings import load_settings

    monkeypatch.setenv("PLATFORM_OUTAGE_WAIT_SECONDS", raw)
    with pytest.raises(ConfigError, match="PLATFORM_OUTAGE_WAIT_SECONDS must be whole seconds"):
        load_settings()


def test_the_platforms_own_unanswered_read_inside_a_batch_is_waited_for() -> None:
    from jobs.kafka_source.spark_kafka import wrapped_unavailable

    text = (
        "[FOREACH_BATCH_USER_FUNCTION_ERROR] ... Traceback (most recent call last):\n"
        "_internal.DeltaError: Generic DeltaTable error: Arrow error: ... Python exception:\n"
        "jobs.errors.KafkaUnavailableError: dead letter clicks[0]@5 could not be read back "
        "within 60 s\n"
    )
    error = wrapped_unavailable(RuntimeError(text))
    assert error is not None and error.while_running
    assert str(error) == "dead letter clicks[0]@5 could not be read back within 60 s"
    # Another platform error whose text carries a Kafka time-out is that error.
    other = (
        "jobs.errors.ConsistencyError: batch 3 does not add up\n"
        "org.apache.kafka.common.errors.TimeoutException: Timed out waiting"
    )
    assert wrapped_unavailable(RuntimeError(other)) is None
    assert unavailable_error(RuntimeError(other)) is None


def test_the_wait_needs_a_leader_for_every_partition_and_ends_at_its_deadline() -> None:
    import time
    from types import SimpleNamespace as Meta

    from jobs.kafka_admin import client_config
    from jobs.streaming.outage import Answer, _leaders, wait_for_brokers

    def topic(*leaders: int) -> Meta:
        return Meta(error=None, partitions={i: Meta(leader=x) for i, x in enumerate(leaders)})

    assert _leaders(Meta(topics={"a": topic(1, 2), "b": topic(3)}), ["a", "b"])
    assert not _leaders(Meta(topics={"a": topic(1, -1)}), ["a"])
    assert not _leaders(Meta(topics={"a": topic(1)}), ["a", "missing"])
    started = time.monotonic()
    nobody = client_config("127.0.0.1:9")  # the discard port: nothing answers
    assert wait_for_brokers(nobody, ["a"], started + 1.0, threading.Event()) is Answer.NONE
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    ("code", "kind"),
    [("NOT_COORDINATOR", "KafkaUnavailableError"), ("GROUP_AUTHORIZATION_FAILED", "OutputError")],
)
def test_an_output_bookmark_read_while_the_coordinator_moves_waits(
    code: str, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A coordinator that moved is asked again, then waited out by a continuous run;
    a refusal stops at once."""
    from confluent_kafka import KafkaError, KafkaException

    from jobs.output import bookmark

    monkeypatch.setattr(bookmark, "TIMEOUT_S", 1.0)
    asked: list[int] = []

    class Consumer:
        def committed(self, *_args: object) -> None:
            asked.append(1)
            raise KafkaException(KafkaError(getattr(KafkaError, code)))

    with pytest.raises(Exception) as raised:
        bookmark.read(Consumer(), "app", "out")  # type: ignore[arg-type]
    assert type(raised.value).__name__ == kind
    assert (len(asked) > 1) == (kind == "KafkaUnavailableError")


def test_a_coordinator_that_is_loading_is_asked_again() -> None:
    """A new cluster's first group: NOT_COORDINATOR, then the committed offset."""
    from types import SimpleNamespace

    from confluent_kafka import KafkaError, KafkaException

    from jobs.output import bookmark

    loading = KafkaError.COORDINATOR_LOAD_IN_PROGRESS
    answers = [KafkaError(KafkaError.NOT_COORDINATOR), KafkaError(loading)]

    class Consumer:
        def committed(self, *_args: object) -> list[object]:
            if answers:
                raise KafkaException(answers.pop(0))
            return [SimpleNamespace(error=None, offset=5, metadata="{}")]

    mark = bookmark.read(Consumer(), "app", "out")  # type: ignore[arg-type]
    assert mark is not None and mark.next_version == 5


@pytest.mark.parametrize(
    ("code", "kind", "message"),
    [
        ("UNKNOWN_TOPIC_OR_PART", "SourceError", "does not exist"),
        ("LEADER_NOT_AVAILABLE", "KafkaUnavailableError", "cannot read the metadata"),
        ("TOPIC_AUTHORIZATION_FAILED", "SourceError", "cannot read the metadata"),
    ],
)
def test_a_topic_the_broker_answers_for_with_an_error_is_said_as_it_is(
    code: str, kind: str, message: str
) -> None:
    """Only a topic the broker does not have "does not exist"; a refusal or a topic
    without a leader yet is said as such."""
    from types import SimpleNamespace

    from confluent_kafka import KafkaError

    from jobs.kafka_admin import topic_partitions

    topic = SimpleNamespace(error=KafkaError(getattr(KafkaError, code)), partitions={})

    class Admin:
        def list_topics(self, timeout: float) -> object:
            return SimpleNamespace(topics={"t": topic})

    with pytest.raises(Exception, match=message) as raised:
        topic_partitions(Admin(), ["t"])  # type: ignore[arg-type]
    assert type(raised.value).__name__ == kind


def test_a_stalled_read_of_the_output_is_not_taken_for_an_empty_one() -> None:
    """Recovering an expired output bookmark reads each partition's newest committed
    record. A fetch that returns nothing (a leader moving, a slow first connection)
    is not the end of the partition: only Kafka's end-of-partition event is, and
    taking a stall for it would republish versions already in the topic."""
    from types import SimpleNamespace

    from confluent_kafka import KafkaError

    from jobs.output import bookmark

    def record(version: int) -> object:
        headers = [
            ("platform.application", b"app"),
            ("platform.state_version", str(version).encode()),
        ]
        return SimpleNamespace(error=lambda: None, headers=lambda: headers)

    end = SimpleNamespace(error=lambda: KafkaError(KafkaError._PARTITION_EOF), headers=lambda: None)

    class Consumer:
        def __init__(self) -> None:
            # a stall first, then the partition's records, then its end
            self.answers: list[list[object]] = [[], [], [record(6), record(7)], [end]]
            self.offset = 0

        def list_topics(self, topic: str, timeout: float) -> object:
            return SimpleNamespace(topics={topic: SimpleNamespace(partitions={0: None})})

        def get_watermark_offsets(self, _tp: object, _timeout: float) -> tuple[int, int]:
            return (0, 2)

        def assign(self, _parts: object) -> None:
            pass

        def unassign(self) -> None:
            pass

        def position(self, parts: list[object]) -> list[object]:
            return [SimpleNamespace(offset=self.offset)]

        def consume(self, _count: int, _timeout: float) -> list[object]:
            answer = self.answers.pop(0) if self.answers else []
            self.offset += sum(1 for m in answer if m is not end)
            return answer

    mark = bookmark.recover(Consumer(), "app", "out")  # type: ignore[arg-type]
    assert mark is not None and mark.next_version == 8
