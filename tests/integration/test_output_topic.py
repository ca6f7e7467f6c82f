"""The output topic, exactly once: a ``read_committed`` consumer sees every state
change once, across SIGKILLs around the Kafka transaction and across operations;
the last value per key and window equals the ``state`` table and plain Python."""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Consumer, TopicPartition
from deltalake import DeltaTable

from jobs import kafka_admin
from jobs.pipeline import load_pipeline
from jobs.settings import Settings
from jobs.streaming.run import run_pipeline
from tests.conftest import pipeline_file, produce, run_jobs, run_with_fault
from tests.conftest import recent_clicks as clicks
from tests.expected import clicks_per_window

pytestmark = pytest.mark.integration
BAD = [b"broken", b'{"user_id": "z"}']


def output_pipeline(tmp_path: Path, topic: str, output: str, **source: object) -> Path:
    path = pipeline_file(tmp_path, "user_clicks", topic, **source)
    data = yaml.safe_load(path.read_text())
    data["output"] = {"topic": output, "partitions": 3}
    path.write_text(yaml.safe_dump(data))
    return path


def read_output(
    config: dict[str, str], topic: str, isolation: str = "read_committed"
) -> list[dict[str, Any]]:
    """Every committed record of ``topic``, partition by partition, in order."""
    found: list[dict[str, Any]] = []
    partitions = kafka_admin.topic_partitions(kafka_admin.admin(config), [topic])[topic]
    for partition in partitions:
        consumer = Consumer(
            {
                **config,
                "group.id": "output-reader",
                "isolation.level": isolation,
                "enable.auto.commit": False,
            }
        )
        consumer.assign([TopicPartition(topic, partition, 0)])
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), 10)
        deadline = time.monotonic() + 30
        while low < high and time.monotonic() < deadline:
            if consumer.position([TopicPartition(topic, partition)])[0].offset >= high:
                break
            for msg in consumer.consume(1000, 0.2):
                if msg.error() is not None:
                    continue
                found.append(
                    {
                        "partition": partition,
                        "key": json.loads(msg.key()),
                        "value": None if msg.value() is None else json.loads(msg.value()),
                        "headers": {k: v.decode() for k, v in msg.headers() or []},
                    }
                )
        consumer.close()
    return found


def assert_each_change_once(records: list[dict[str, Any]]) -> None:
    """No state version published a key twice (a replayed transaction would)."""
    seen = Counter(
        (r["headers"]["platform.state_version"], json.dumps(r["key"], sort_keys=True))
        for r in records
    )
    assert max(seen.values(), default=1) == 1, [k for k, n in seen.items() if n > 1][:5]


def identity(key: dict[str, Any]) -> tuple[str, str]:
    return key["user_id"], key["window_start"]


def last_values(records: list[dict[str, Any]]) -> dict[tuple[str, str], int]:
    """The topic read as a table: the last record per key and window (all windows of
    a user are in one partition, in order); a tombstone removes it."""
    last: dict[tuple[str, str], int] = {}
    for record in records:
        if record["value"] is None:
            last.pop(identity(record["key"]), None)
        else:
            last[identity(record["key"])] = record["value"]["aggregates"]["clicks"]
    return last


def iso(moment: Any) -> str:
    return str(moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ"))


def state_table(warehouse: Path) -> dict[tuple[str, str], int]:
    rows = DeltaTable(str(warehouse / "user_clicks" / "state")).to_pyarrow_table().to_pylist()
    return {(r["user_id"], iso(r["window_start"])): r["clicks"] for r in rows}


def expected_counts(*batches: list[bytes]) -> dict[tuple[str, str], int]:
    counts, _dead, late = clicks_per_window(list(batches))
    assert late == 0
    return {
        (user, time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(start))): n
        for (user, start), n in counts.items()
    }


def test_every_change_once_across_crashes_around_the_kafka_transaction(  # type: ignore[no-untyped-def]
    broker, kafka_config, new_topic, tmp_path
) -> None:
    topic, output = new_topic(3), f"out_{new_topic(1)}"
    values = clicks(2000, 11, users=23) + BAD
    produce(kafka_config, topic, values)
    pipeline = output_pipeline(tmp_path, topic, output, max_offsets_per_trigger=700)
    warehouse = tmp_path / "warehouse"
    # Killed with the ledger committed and no transaction begun; with the records
    # sent and the transaction open; with the transaction committed and Spark's own
    # batch commit not yet. Each next run recovers.
    for fault in ("after_ledger@0", "during_output@1", "after_output@2"):
        assert run_with_fault(pipeline, broker.bootstrap_servers, warehouse, fault) == -9
    assert run_with_fault(pipeline, broker.bootstrap_servers, warehouse, None) == 0

    records = read_output(kafka_config, output)
    assert_each_change_once(records)
    changes = [r for r in records if r["headers"]["platform.kind"] == "change"]
    assert {r["headers"]["platform.kind"] for r in records} == {"change"}  # first snapshot: empty
    changelog = DeltaTable(str(warehouse / "user_clicks" / "changelog")).to_pyarrow_table()
    expected_rows = Counter(
        (r["epoch"], r["batch_id"], r["user_id"], iso(r["window_start"]), r["clicks"])
        for r in changelog.to_pylist()
    )
    published_rows = Counter(
        (
            int(r["headers"]["platform.epoch"]),
            int(r["headers"]["platform.batch"]),
            r["key"]["user_id"],
            r["key"]["window_start"],
            r["value"]["aggregates"]["clicks"],
        )
        for r in changes
    )
    assert published_rows == expected_rows  # every changelog row, exactly once
    assert sorted({r["headers"]["platform.batch"] for r in changes}) == ["0", "1", "2"]
    assert all(r["headers"]["platform.application"] == "user_clicks" for r in records)
    assert last_values(records) == state_table(warehouse) == expected_counts(values)
    # The killed transaction's records are in the log, and not visible to the reader.
    everything = read_output(kafka_config, output, "read_uncommitted")
    aborted = len(everything) - len(records)
    batch_1 = sum(1 for r in changes if r["headers"]["platform.batch"] == "1")
    seen = Counter(json.dumps(r, sort_keys=True) for r in records)
    extra = Counter(json.dumps(r, sort_keys=True) for r in everything) - seen
    assert aborted == batch_1 > 0
    assert {json.loads(k)["headers"]["platform.batch"] for k in extra} == {"1"}


def test_operations_publish_corrections(  # type: ignore[no-untyped-def]
    spark, settings: Settings, kafka_config, new_topic, tmp_path
) -> None:
    topic, output = new_topic(1), f"out_{new_topic(1)}"
    path = output_pipeline(tmp_path, topic, output, max_offsets_per_trigger=400)
    pipeline = load_pipeline(str(path), tmp_path)
    warehouse = settings.warehouse
    first, second = clicks(600, 21), clicks(500, 22)
    produce(kafka_config, topic, first)
    run_pipeline(spark, pipeline, settings)  # batches end at 400, 600
    produce(kafka_config, topic, second)
    run_pipeline(spark, pipeline, settings)
    assert last_values(read_output(kafka_config, output)) == expected_counts(first, second)

    # Back to the boundary at offset 400: the restore goes out as corrections.
    spec = json.dumps({topic: {"0": 400}})
    rewound = run_jobs(path, settings, "rewind", "--to-offset", spec, "--reason", "replay")
    assert rewound.returncode == 0, rewound.stderr
    assert re.search(r"output: \d+ record\(s\) of \d+ state version\(s\) published", rewound.stdout)
    records = read_output(kafka_config, output)
    assert_each_change_once(records)
    corrections = [r for r in records if r["headers"]["platform.kind"] == "correction"]
    assert corrections and {r["headers"]["platform.operation"] for r in corrections} == {"rewind"}
    assert last_values(records) == state_table(warehouse) == expected_counts(first[:400])

    run_pipeline(spark, pipeline, settings)  # replays 400..1100
    assert last_values(read_output(kafka_config, output)) == expected_counts(first, second)

    # Emptied and recomputed from the source: tombstones, then the replay's changes.
    rebuilt = run_jobs(path, settings, "rebuild", "--reason", "distrust", "--from-source")
    assert rebuilt.returncode == 0, rebuilt.stderr
    records = read_output(kafka_config, output)
    assert last_values(records) == state_table(warehouse) == {}
    run_pipeline(spark, pipeline, settings)
    records = read_output(kafka_config, output)
    assert_each_change_once(records)
    assert last_values(records) == state_table(warehouse) == expected_counts(first, second)

    dry = run_jobs(path, settings, "publish", "--reason", "check", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "nothing to publish" in dry.stdout
    status = run_jobs(path, settings, "status", "--json")
    report = json.loads(status.stdout)["output"]
    assert report["unpublished_versions"] == 0
    assert (
        report["published_through"]
        == DeltaTable(str(warehouse / "user_clicks" / "state")).version()
    )
