"""A backfill from a raw archive larger than the driver's memory: Spark reads the
archive's files itself; nothing of it passes through the driver."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest
import yaml
from confluent_kafka import TopicPartition
from deltalake import DeltaTable

from jobs import kafka_admin
from jobs.settings import REPO_ROOT
from tests.conftest import run_jobs
from tests.integration.test_backfill import SIGNS, signed_qty

pytestmark = pytest.mark.integration
RECORDS = 60_000
PARTITIONS = 4
PAD = 10_000  # bytes per record: about 600 MB of raw archive


def pipeline(tmp_path: Path, topic: str, version: int) -> Path:
    data = yaml.safe_load((REPO_ROOT / "include" / "pipelines" / "inventory.yaml").read_text())
    data["source"].update({"topics": [topic], "archive": True, "max_offsets_per_trigger": 10_000})
    data["version"] = version
    data["derived"][0]["expr"] = signed_qty(version)
    path = tmp_path / f"v{version}" / "inventory.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(data))
    return path


def test_backfill_from_an_archive_larger_than_the_driver(  # type: ignore[no-untyped-def]
    spark, settings, kafka_config, new_topic, tmp_path
) -> None:
    topic = new_topic(PARTITIONS, {"retention.ms": "-1", "retention.bytes": "-1"})
    kinds = ["receipt", "receipt", "sale", "return"]
    events = [
        {"sku": f"S{i % 37}", "qty": 1 + i % 5, "kind": kinds[i % 4], "timestamp": 1700000000}
        for i in range(RECORDS)
    ]
    v1, v2 = pipeline(tmp_path, topic, 1), pipeline(tmp_path, topic, 2)
    kafka_admin.produce_all(
        kafka_config,
        topic,
        # Random padding: Parquet cannot compress it away.
        (
            (None, json.dumps({**e, "pad": os.urandom(PAD // 2).hex()}).encode(), None)
            for e in events
        ),
    )
    # The stream that archives them runs in this process (only the backfill must
    # run in a driver of 512m: a process of its own).
    streamed = run_jobs(v1, settings, "run", "--quiet", spark=spark)
    assert streamed.returncode == 0, streamed.stderr[-3000:]
    # The records leave Kafka, as retention would: the backfill has only the archive.
    admin = kafka_admin.admin(kafka_config)
    marks = kafka_admin.watermarks(kafka_config, [(topic, p) for p in range(PARTITIONS)])
    ends = [TopicPartition(topic, p, high) for (_t, p), (_low, high) in marks.items()]
    for future in admin.delete_records(ends).values():
        future.result()
    raw = Path(settings.warehouse / "inventory" / "raw")
    archive_bytes = sum(f.stat().st_size for f in raw.rglob("*.parquet"))
    assert archive_bytes > 512 * 2**20, archive_bytes

    backfill = run_jobs(
        v2,
        settings,
        "backfill",
        "--from-earliest",
        "--source",
        "archive",
        "--reason",
        "returns were subtracted",
        env={"PLATFORM_SPARK_DRIVER_MEMORY": "512m"},
    )
    # Both ends of stderr: a JVM that died says why near the start, Python at the end.
    assert backfill.returncode == 0, backfill.stderr[:3000] + "\n...\n" + backfill.stderr[-3000:]
    expected: Counter[str] = Counter()
    for e in events:
        expected[e["sku"]] += SIGNS[2][e["kind"]] * e["qty"]
    state = DeltaTable(str(settings.warehouse / "inventory" / "state")).to_pyarrow_table()
    assert {r["sku"]: r["quantity"] for r in state.to_pylist()} == dict(expected)
