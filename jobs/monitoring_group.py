"""The application's consumer group in Kafka, for monitoring only.

Spark's Kafka source commits no offsets, so Kafka's own tools
(``kafka-consumer-groups``, Kafka UIs, Burrow) would not see an application. After
each committed batch the platform commits the batch's end offsets to the group
``platform.<application_id>``; an operation commits the offsets its cut starts
from, so a rewind shows there too. Nothing reads the group back: a run starts from
its cut and Spark's checkpoint, never from it. A commit that fails is logged and
the batch stands (the next batch commits again).

A secured cluster needs the ACL ``READ`` on group ``platform.<application_id>``
(``DESCRIBE`` on the topics the application already has).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

PREFIX = "platform."
TIMEOUT_S = 5.0

log = logging.getLogger(__name__)


def group_id(application_id: str) -> str:
    return PREFIX + application_id


def commit(
    client: AdminClient, application_id: str, offsets: Mapping[str, Mapping[str, int]]
) -> bool:
    """Commit ``offsets`` (topic -> partition -> next offset, the offset log's
    shape) to the application's group; False (logged) when Kafka refused or did
    not answer within ``TIMEOUT_S``."""
    partitions = [
        TopicPartition(topic, int(partition), int(offset))
        for topic, parts in sorted(offsets.items())
        for partition, offset in sorted(parts.items(), key=lambda p: int(p[0]))
    ]
    if not partitions:
        return True
    group = group_id(application_id)
    try:
        futures: dict[Any, Any] = client.alter_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(group, partitions)], request_timeout=TIMEOUT_S
        )
        for future in futures.values():
            result = future.result(timeout=TIMEOUT_S * 2)
            failed = [p for p in result.topic_partitions if p.error is not None]
            if failed:
                raise KafkaException(failed[0].error)
    except Exception as exc:  # monitoring only: the batch or operation stands
        log.warning(
            "could not commit %s's offsets to consumer group %s: %s", application_id, group, exc
        )
        return False
    return True
