"""The application's consumer group in Kafka, for monitoring only.

Spark's Kafka source commits no offsets, so Kafka's own tools
(``kafka-consumer-groups``, Kafka UIs, Burrow) would not see an application. After
each committed batch the platform commits the batch's end offsets to the group
``platform.<application_id>``; an operation commits the offsets its cut starts
from, so a rewind shows there too. Nothing reads the group back: a run starts from
its cut and Spark's checkpoint, never from it.

The commits are a consumer's (a group member that never joins: no subscription),
sent asynchronously: a commit never holds a batch up, and one sent while the
group's coordinator moves waits for the new one. (The admin API's offset commit
is not used: when its coordinator's connection drops, librdkafka 2.16 aborts the
whole process, librdkafka PR 5397.) A commit that fails is logged; the next one
corrects the group. A secured cluster needs the ACL ``READ`` on group
``platform.<application_id>``.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

PREFIX = "platform."
TIMEOUT_S = 5.0
Offsets = Mapping[str, Mapping[str, int]]  # topic -> partition -> next offset

log = logging.getLogger(__name__)


def group_id(application_id: str) -> str:
    return PREFIX + application_id


class _Member:
    """The one consumer this process commits to a group with, and its commits not
    answered yet: commits through one connection reach Kafka in the order sent, so
    a late one of an earlier run never lands after a newer run's."""

    def __init__(self, config: Mapping[str, Any], group: str) -> None:
        self.group = group
        self.pending = 0
        self.lock = threading.Lock()  # (the warm driver's runs share it)
        self.consumer = Consumer(
            {**config, "group.id": group, "enable.auto.commit": False, "on_commit": self.answered}
        )

    def answered(self, error: KafkaError | None, partitions: list[TopicPartition]) -> None:
        with self.lock:
            self.pending = max(0, self.pending - 1)
        failed = [p.error for p in partitions if p.error is not None]
        if error is not None or failed:
            log.warning("group %s refused offsets: %s", self.group, error or failed[0])


_MEMBERS: dict[tuple[str, str], _Member] = {}
_MEMBERS_LOCK = threading.Lock()


def _member(config: Mapping[str, Any], group: str, create: bool = True) -> _Member | None:
    key = (group, repr(sorted((k, str(v)) for k, v in config.items())))
    with _MEMBERS_LOCK:
        if key not in _MEMBERS and create:
            _MEMBERS[key] = _Member(config, group)
        return _MEMBERS.get(key)


@atexit.register
def _let_go() -> None:
    """A consumer's close waits for its unanswered commits (45 s and more while the
    group's coordinator has no quorum): each runs on a thread of its own, which a
    process that ends first ends."""
    with _MEMBERS_LOCK:
        members = list(_MEMBERS.values())
        _MEMBERS.clear()
    for member in members:
        threading.Thread(target=member.consumer.close, name="monitoring-group", daemon=True).start()


class MonitoringGroup:
    """Commits to one application's group; ``close`` waits a moment for them."""

    def __init__(self, config: Mapping[str, Any], application_id: str) -> None:
        self.config = dict(config)
        self.group = group_id(application_id)

    def commit(self, offsets: Offsets) -> None:
        """Send ``offsets``. Never raises, never waits."""
        partitions = [
            TopicPartition(topic, int(partition), int(offset))
            for topic, parts in sorted(offsets.items())
            for partition, offset in sorted(parts.items(), key=lambda p: int(p[0]))
        ]
        if not partitions:
            return
        try:
            member = _member(self.config, self.group)
            assert member is not None
            member.consumer.poll(0)  # the answers to earlier commits
            with member.lock:
                member.pending += 1  # before: its answer may come on another thread
            try:
                member.consumer.commit(offsets=partitions, asynchronous=True)
            except Exception:
                member.answered(None, [])
                raise
        except Exception as exc:  # monitoring only: the batch or operation stands
            log.warning("could not commit offsets to group %s: %s", self.group, exc)

    def close(self, timeout_s: float = TIMEOUT_S) -> None:
        """Wait (at most ``timeout_s``) for the commits to reach Kafka. The consumer
        stays for the process's next commits to the group (in order after these)."""
        member = _member(self.config, self.group, create=False)
        if member is None:
            return
        deadline = time.monotonic() + timeout_s
        while member.pending and time.monotonic() < deadline:
            member.consumer.poll(0.1)
        if member.pending:
            log.warning("%s: the last offsets did not reach Kafka in time", self.group)


def commit_once(config: Mapping[str, Any], application_id: str, offsets: Offsets) -> None:
    """Commit ``offsets`` and wait for them a moment (an operation's cut). Never raises."""
    group = MonitoringGroup(config, application_id)
    group.commit(offsets)
    group.close()
