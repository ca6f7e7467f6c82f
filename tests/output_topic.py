"""Reading an output topic in tests: every committed record, and the topic read
as a table (the last value per key and window), against independent results."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka import Consumer, TopicPartition
from deltalake import DeltaTable

from jobs import kafka_admin
from tests.conftest import pipeline_file
from tests.expected import clicks_per_window


def with_output(path: Path, output: str, partitions: int = 3) -> Path:
    """The pipeline file at ``path``, publishing to ``output``."""
    data = yaml.safe_load(path.read_text())
    data["output"] = {"topic": output, "partitions": partitions}
    path.write_text(yaml.safe_dump(data))
    return path


def output_pipeline(tmp_path: Path, topic: str, output: str, **source: object) -> Path:
    return with_output(pipeline_file(tmp_path, "user_clicks", topic, **source), output)


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
    """The topic read as a table: the last record per Kafka key (user and window,
    its end included: a window-size change makes new keys), a tombstone removes it;
    then by user and window start, as the state table is keyed."""
    last: dict[str, tuple[tuple[str, str], int]] = {}
    for record in records:
        kafka_key = json.dumps(record["key"], sort_keys=True)
        if record["value"] is None:
            last.pop(kafka_key, None)
        else:
            last[kafka_key] = (identity(record["key"]), record["value"]["aggregates"]["clicks"])
    return dict(last.values())


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


def assert_published_like_the_changelog(records: list[dict[str, Any]], warehouse: Path) -> None:
    """Every changelog row of a batch is one record of kind ``change``, once."""
    assert_each_change_once(records)
    changes = [r for r in records if r["headers"]["platform.kind"] == "change"]
    changelog = DeltaTable(str(warehouse / "user_clicks" / "changelog")).to_pyarrow_table()
    expected_rows = Counter(
        (r["epoch"], r["batch_id"], r["user_id"], iso(r["window_start"]), r["clicks"])
        for r in changelog.to_pylist()
        if r["batch_id"] >= 0
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
    assert published_rows == expected_rows
