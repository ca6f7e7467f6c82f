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
import time
from collections.abc import Mapping
from dataclasses import dataclass

from confluent_kafka import KafkaException

from jobs import kafka_admin

log = logging.getLogger(__name__)
# How often the brokers are asked whether they answer again.
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


def wait_for_brokers(config: Mapping[str, str], deadline: float) -> bool:
    """Whether the cluster answers a metadata request before ``deadline``
    (monotonic seconds)."""
    client = kafka_admin.admin(config)
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        try:
            metadata = client.list_topics(timeout=max(0.5, min(5.0, remaining)))
            if metadata.brokers:
                return True
        except KafkaException:
            kafka_admin.serve_callbacks(client)
        time.sleep(min(PROBE_S, max(0.0, deadline - time.monotonic())))
