"""An application's lag in Kafka's own tool: ``kafka-consumer-groups --describe``
(``ConsumerGroupCommand`` from the resolved jars) reads the group the platform
commits after each batch and each operation (``jobs/monitoring_group.py``)."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from jobs import broker as embedded
from jobs.monitoring_group import group_id
from tests.conftest import pipeline_file, produce, recent_clicks, run_jobs

pytestmark = pytest.mark.integration
TOOL = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"


def described(servers: str, group: str, topic: str) -> dict[int, tuple[int, int, int]]:
    """``topic``'s partition -> (current offset, log end offset, lag), as Kafka's tool
    prints them (the group may hold other topics: earlier tests' applications)."""
    command = embedded.java_command(
        TOOL, "--bootstrap-server", servers, "--describe", "--group", group, tool=True
    )
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows: dict[int, tuple[int, int, int]] = {}
    lines = [line.split() for line in done.stdout.splitlines() if line.strip()]
    header = next(i for i, cells in enumerate(lines) if cells[:2] == ["GROUP", "TOPIC"])
    names = lines[header]
    for cells in lines[header + 1 :]:
        row = dict(zip(names, cells, strict=False))
        if row.get("TOPIC") != topic:
            continue
        rows[int(row["PARTITION"])] = (
            int(row["CURRENT-OFFSET"]),
            int(row["LOG-END-OFFSET"]),
            int(row["LAG"]),
        )
    return rows


def test_kafka_s_own_tool_shows_the_application_s_lag(  # type: ignore[no-untyped-def]
    spark, broker, settings, kafka_config, new_topic, tmp_path
) -> None:
    topic = new_topic(2)
    path = pipeline_file(tmp_path, "user_clicks", topic)
    values = recent_clicks(40, 1)
    produce(kafka_config, topic, values)
    ran: Any = run_jobs(path, settings, "run", spark=spark)
    assert ran.returncode == 0, ran.stderr
    group = group_id("user_clicks")
    after_run = described(broker.bootstrap_servers, group, topic)
    assert sum(end for _cur, end, _lag in after_run.values()) == len(values)
    assert all(cur == end and lag == 0 for cur, end, lag in after_run.values())

    produce(kafka_config, topic, recent_clicks(7, 2))
    waiting = described(broker.bootstrap_servers, group, topic)
    assert sum(lag for _cur, _end, lag in waiting.values()) == 7  # not read yet

    # A rewind to the beginning shows the whole topic as lag, before any run.
    rewound = run_jobs(
        path,
        settings,
        "rewind",
        "--to-earliest",
        "--mode",
        "reprocess",
        "--reason",
        "lag shows the rewind",
        spark=spark,
    )
    assert rewound.returncode == 0, rewound.stderr
    after_rewind = described(broker.bootstrap_servers, group, topic)
    assert all(cur == 0 for cur, _end, _lag in after_rewind.values())
    assert sum(lag for _cur, _end, lag in after_rewind.values()) == len(values) + 7
