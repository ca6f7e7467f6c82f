"""Reading Kafka with Spark's own Kafka source (``spark-sql-kafka-0-10``, from the
jars ``make setup`` resolved: ``python -m jobs jars``).

One place owns the options every read of the platform uses: read-committed
isolation (aborted transactions and their markers are never records), and
``failOnDataLoss=true`` (offsets that retention deleted, a recreated or shrunk
topic, a vanished partition fail the read instead of silently shortening it).
"""

from __future__ import annotations

import json
import re

from pyspark.sql import DataFrame, SparkSession

from jobs import kafka_settings
from jobs.errors import (
    SQLSTATE,
    WRAPPED_ERROR,
    KafkaUnavailableError,
    SourceError,
    jvm_trace,
)
from jobs.kafka_source.offsets import Offsets, to_json_dict

FORMAT = "kafka"
# The columns of Spark's Kafka source (without includeHeaders).
COLUMNS = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int"
)
# Records per task of a batch read: both cores work on a one-partition topic, and
# progress is seen task by task.
BATCH_SPLIT_RECORDS = 250_000
# Client settings the platform fixes for exactness (over a user's setting).
FIXED = {"isolation.level": "read_committed"}
# Client settings the platform starts from (a user's own setting wins). When a
# partition's leader dies, Spark's offset lookup waits out the admin client's whole
# default.api.timeout.ms (60 s) before its retry finds the new leader: measured on
# a three-node cluster, a scheduled run stalled 62 s, and 16 s with these. (Kafka
# wants default.api.timeout.ms >= request.timeout.ms: a user's either replaces both.)
DEFAULTS = {"default.api.timeout.ms": "15000", "request.timeout.ms": "10000"}
# Client settings for throughput, each replaced by a user's own. Spark's consumer
# polls for every max.poll.records records (Kafka's default: 500), and a poll has a
# cost of its own: a read of 1M click records took 2.8-3.0 s with Kafka's defaults
# and 1.8-2.1 s with these (docs/benchmarks.md, "Issue 45"). A task's consumer
# reads one partition, so a fetch holds at most 4 MiB (or one larger batch) a task.
THROUGHPUT = {"max.poll.records": "10000", "max.partition.fetch.bytes": str(4 << 20)}


def source_options(bootstrap_servers: str, client_settings: dict[str, str]) -> dict[str, str]:
    """Options of every Kafka read: the broker, the client settings users pass
    through (``PLATFORM_KAFKA_*`` -> ``kafka.*``) over the platform's defaults,
    read-committed, no silent loss."""
    java = kafka_settings.for_java(client_settings)
    if not DEFAULTS.keys() & java.keys():
        java = {**DEFAULTS, **java}
    java = {**THROUGHPUT, **java}
    options = {f"kafka.{key}": value for key, value in java.items()}
    options["kafka.bootstrap.servers"] = bootstrap_servers
    options.update({f"kafka.{key}": value for key, value in FIXED.items()})
    options["failOnDataLoss"] = "true"
    return options


def read_range(
    spark: SparkSession,
    bootstrap_servers: str,
    client_settings: dict[str, str],
    start: Offsets,
    end: Offsets,
    headers: bool = False,
) -> DataFrame:
    """Exactly the records at offsets ``[start, end)`` of each partition in ``end``
    (a partition missing from ``start`` contributes nothing), as a batch DataFrame
    with the columns of Spark's Kafka source (``headers``: and the records' headers,
    which the source reads only when asked)."""
    # ``assign`` names exactly the partitions read: Spark wants every assigned
    # partition in both offset maps, and no others.
    assign: dict[str, list[int]] = {}
    for topic, partition in sorted(end):
        assign.setdefault(topic, []).append(partition)
    first = {tp: min(start.get(tp, stop), stop) for tp, stop in end.items()}
    reader = spark.read.format(FORMAT)
    for key, value in source_options(bootstrap_servers, client_settings).items():
        reader = reader.option(key, value)
    return (
        reader.option("assign", json.dumps(assign))
        .option("startingOffsets", json.dumps(to_json_dict(first)))
        .option("endingOffsets", json.dumps(to_json_dict(end)))
        .option("maxRecordsPerPartition", str(BATCH_SPLIT_RECORDS))
        .option("includeHeaders", str(headers).lower())
        .load()
    )


def data_loss_error(error: BaseException) -> SourceError | None:
    """Spark's failure of a read whose records Kafka no longer has (retention, a
    recreated or shrunk topic, a vanished partition: its message names the option
    ``failOnDataLoss``), as the platform's error with the repair; None otherwise."""
    text = str(error)
    if "failOnDataLoss" not in text:
        return None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    detail = next((line for line in lines if "offset" in line.lower()), lines[0])
    return SourceError(
        f"Kafka no longer has records the run needs: {detail[:300]}; nothing of the batch "
        "is committed. python -m jobs status --pipeline ... names the partition and offsets; "
        "repair: raise the topic's retention, then python -m jobs rewind --mode skip "
        "--reason ... to accept the loss explicitly (or backfill --source archive)"
    )


# Kafka's client gave up waiting for the cluster: Spark's consumer in a task, or its
# admin client planning a batch. Retriable in Kafka's terms: nothing is lost.
# Spark's own time-out of a fetch (``kafkaConsumer.pollTimeoutMs``, 120 s by
# default) is Java's TimeoutException with its own words. A broker's address that
# answers Kafka's protocol but not as a broker (a controller listener took the port
# while the broker was down) is a broker that does not answer: waited for, bounded.
UNAVAILABLE = re.compile(
    r"org\.apache\.kafka\.common\.errors\.(TimeoutException|DisconnectException|"
    r"NetworkException|LeaderNotAvailableException|NotLeaderOrFollowerException): ([^\n]*)"
    r"|java\.util\.concurrent\.(TimeoutException): (Cannot fetch record for offset [^\n]*)"
    r"|org\.apache\.kafka\.common\.errors\.(UnsupportedVersionException): "
    r"(The node does not support [^\n]*)"
)


# The platform's own error raised inside foreachBatch (dead letters read back),
# wrapped in Spark's: the query had reached Kafka.
WRAPPED_UNAVAILABLE = re.compile(r"jobs\.errors\.KafkaUnavailableError: (.+?)(?:\n|$| SQLSTATE)")


def wrapped_unavailable(error: BaseException) -> KafkaUnavailableError | None:
    found = WRAPPED_UNAVAILABLE.search(f"{error}\n{jvm_trace(error)}")
    return None if found is None else KafkaUnavailableError(found.group(1), while_running=True)


def unavailable_error(error: BaseException) -> KafkaUnavailableError | None:
    """Spark's failure of a query because Kafka did not answer, as the platform's
    error; None otherwise (records that are gone are ``data_loss_error``'s)."""
    text = f"{error}\n{jvm_trace(error)}"
    found = UNAVAILABLE.search(text)
    if found is None or "failOnDataLoss" in text or WRAPPED_ERROR.search(text):
        return None  # records that are gone; the platform's own error, Kafka's inside
    groups = found.groups()  # (kind, detail) of each alternative; one matched
    kind, detail = next((k, d) for k, d in zip(groups[::2], groups[1::2], strict=True) if k)
    detail = SQLSTATE.sub("", detail).strip()[:300]
    return KafkaUnavailableError(
        f"Kafka did not answer ({kind}: {detail}); nothing of the batch is "
        "committed, and the next run replays it (a continuous run first waits "
        "PLATFORM_OUTAGE_WAIT_SECONDS for the brokers)",
        while_running=True,
        detail=f"{kind}: {detail}",
    )


__all__ = [
    "COLUMNS",
    "FORMAT",
    "data_loss_error",
    "read_range",
    "source_options",
    "unavailable_error",
    "wrapped_unavailable",
]
