"""A continuous run that Kafka stopped answering: it waits for the brokers and
starts again from its checkpoint, in this process, for a bounded time.

A query that fails because Kafka did not answer (``KafkaUnavailableError``) has
committed nothing of its batch, so starting the run again is what a supervisor's
restart would do, minus a new JVM. The wait is ``PLATFORM_OUTAGE_WAIT_SECONDS``
from the outage's first failure (Kafka Streams' ``task.timeout.ms`` plays this
part there); a run that commits a batch in between starts a new outage's clock.
Past it, the run stops with the error line. Scheduled (available-now) runs never
wait: Airflow's retries are their restart.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from typing import Any

from confluent_kafka import KafkaException

from jobs import kafka_admin

log = logging.getLogger(__name__)
# How often the brokers are asked whether they answer again (and the longest a
# request of it waits).
PROBE_S = 2.0


@dataclass
class OutageClock:
    """When the current outage began, and until when it may be waited out."""

    wait_s: float
    began: float | None = None

    def deadline(self, now: float, progressed: bool) -> float | None:
        """A run failed at ``now`` because Kafka did not answer; ``progressed``: it
        committed a batch since the previous failure. The time to wait until for
        the brokers, or None: the wait is spent (or off), stop."""
        if self.began is None or progressed:
            self.began = now
        end = self.began + self.wait_s
        return end if now < end else None


class Answer(Enum):
    LEADERS = "every partition of the topics has a leader again"
    NONE = "no answer before the deadline"
    STOPPED = "a stop was requested (SIGTERM, SIGINT)"


@contextmanager
def stop_signals() -> Iterator[threading.Event]:
    """An event SIGTERM and SIGINT set while the block runs (in the main thread; a
    warm driver's runs are stopped otherwise): one for a whole run, so a stop asked
    while a query fails or while the run waits for Kafka is never lost."""
    stop = threading.Event()
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, lambda _signum, _frame: stop.set())
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def wait_for_brokers(
    config: Mapping[str, str], topics: Iterable[str], deadline: float, stop: threading.Event
) -> Answer:
    """Ask the cluster for ``topics``' metadata every ``PROBE_S`` until each of their
    partitions has a leader, the ``deadline`` (monotonic seconds) passes, or ``stop``
    is set (``stop_signals``)."""
    client = kafka_admin.admin(config)
    # A pause first, also when the brokers answer at once: a restart that fails
    # again at once does not spin.
    while not stop.wait(min(PROBE_S, max(0.0, deadline - time.monotonic()))):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return Answer.NONE
        try:
            metadata = client.list_topics(timeout=max(0.5, min(PROBE_S, remaining)))
            if _leaders(metadata, topics):
                return Answer.LEADERS
        except KafkaException:
            kafka_admin.serve_callbacks(client)
    return Answer.STOPPED


def _leaders(metadata: Any, topics: Iterable[str]) -> bool:
    found = [metadata.topics.get(topic) for topic in topics]
    return all(
        t is not None
        and t.error is None
        and t.partitions
        and all(p.leader >= 0 for p in t.partitions.values())
        for t in found
    )
