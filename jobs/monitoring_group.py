"""The application's consumer group in Kafka, for monitoring only.

Spark's Kafka source commits no offsets, so Kafka's own tools
(``kafka-consumer-groups``, Kafka UIs, Burrow) would not see an application. After
each committed batch the platform commits the batch's end offsets to the group
``platform.<application_id>``; an operation commits the offsets its cut starts
from, so a rewind shows there too. Nothing reads the group back: a run starts from
its cut and Spark's checkpoint, never from it.

A commit never holds a batch up: it is sent and the batch goes on; offsets that
arrive while one is in flight replace each other and go next (only the newest
matters). A commit that fails is logged; the next one corrects the group. A
secured cluster needs the ACL ``READ`` on group ``platform.<application_id>``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient

PREFIX = "platform."
TIMEOUT_S = 5.0
Offsets = Mapping[str, Mapping[str, int]]  # topic -> partition -> next offset

log = logging.getLogger(__name__)


def group_id(application_id: str) -> str:
    return PREFIX + application_id


class MonitoringGroup:
    """Commits to one application's group, one request in flight at a time."""

    def __init__(self, config: Mapping[str, Any], application_id: str) -> None:
        self.config = dict(config)
        self.group = group_id(application_id)
        self._client: AdminClient | None = None
        self._guard = threading.Condition()
        self._queued: Offsets | None = None
        self._in_flight = False

    def commit(self, offsets: Offsets) -> None:
        """Send ``offsets`` (after the one in flight, if any). Never raises."""
        with self._guard:
            self._queued = offsets
            if not self._in_flight:
                self._send()

    def close(self, timeout_s: float = TIMEOUT_S) -> None:
        """Wait (at most ``timeout_s``) for what was committed to reach Kafka."""
        deadline = time.monotonic() + timeout_s
        with self._guard:
            while self._in_flight or self._queued is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    log.warning("%s: the last offsets did not reach Kafka in time", self.group)
                    return
                self._guard.wait(left)

    def _send(self) -> None:  # holds the guard
        offsets, self._queued = self._queued, None
        if offsets is None:
            return
        try:
            partitions = [
                TopicPartition(topic, int(partition), int(offset))
                for topic, parts in sorted(offsets.items())
                for partition, offset in sorted(parts.items(), key=lambda p: int(p[0]))
            ]
            if not partitions:
                return
            if self._client is None:
                self._client = AdminClient(self.config)
            futures = self._client.alter_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(self.group, partitions)], request_timeout=TIMEOUT_S
            )
        except Exception as exc:  # monitoring only: the batch or operation stands
            log.warning("could not commit offsets to group %s: %s", self.group, exc)
            return
        self._in_flight = True
        for future in futures.values():
            future.add_done_callback(self._done)

    def _done(self, future: Any) -> None:
        try:
            result = future.result()
            failed = [p for p in result.topic_partitions if p.error is not None]
            if failed:
                log.warning("group %s refused offsets: %s", self.group, failed[0].error)
        except Exception as exc:
            log.warning("could not commit offsets to group %s: %s", self.group, exc)
        with self._guard:
            self._in_flight = False
            self._send()
            self._guard.notify_all()


def commit_once(config: Mapping[str, Any], application_id: str, offsets: Offsets) -> None:
    """Commit ``offsets`` and wait for them a moment (an operation's cut). Never raises."""
    group = MonitoringGroup(config, application_id)
    group.commit(offsets)
    group.close()
