"""A burst of large bad records with the driver at 512m: dead letters are written with
bounded memory (positions and reasons reach the driver, values are streamed from
Kafka into the commit), so the batch commits and every record is kept exactly once.

Before: each bad record travelled base64-encoded inside the batch's observed
metrics, which the driver collects and Spark keeps for 100 batches of progress.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.compute as pc
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from deltalake import DeltaTable

from jobs import kafka_admin
from jobs.settings import REPO_ROOT
from tests.conftest import pipeline_file

pytestmark = pytest.mark.integration
RECORDS = 700  # 700 MB of bad records: more than the driver's whole heap
PARTITIONS = 10  # two tasks at a time read 140 MB between them
SIZE = 1024 * 1024


def test_700_mb_of_1mb_bad_records_with_the_driver_at_512m(
    broker, kafka_config, new_topic, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(PARTITIONS, {"max.message.bytes": str(2 * SIZE)})
    producer = Producer(
        {**kafka_config, "enable.idempotence": True, "message.max.bytes": 2 * SIZE, "linger.ms": 5}
    )
    now_ms = int(time.time() * 1000)
    for i in range(RECORDS):
        # Distinct, not JSON: "<i>" then filler, so each dead letter can be told apart.
        value = f"{i:08d}".encode() + b"x" * (SIZE - 8)
        while True:
            try:
                producer.produce(topic, value, partition=i % PARTITIONS, timestamp=now_ms)
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(120) == 0
    produced = sum(
        high
        for _low, high in kafka_admin.watermarks(
            kafka_config, [(topic, p) for p in range(PARTITIONS)]
        ).values()
    )
    assert produced == RECORDS
    try:
        check_run_and_tables(broker, topic, tmp_path)
    finally:  # free the shared broker's disk
        admin = AdminClient(kafka_config)  # held: the future needs its live handle
        admin.delete_topics([topic])[topic].result()


def check_run_and_tables(broker, topic: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = pipeline_file(tmp_path, "user_clicks", topic, max_offsets_per_trigger=RECORDS)
    warehouse = tmp_path / "warehouse"
    env = {**os.environ, "PLATFORM_SPARK_DRIVER_MEMORY": "512m"}
    proc = subprocess.run(
        [sys.executable, "-m", "jobs", "run", "--pipeline", str(path), "--quiet"]
        + ["--bootstrap-servers", broker.bootstrap_servers, "--warehouse", str(warehouse)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]

    root = warehouse / "user_clicks"
    dataset = DeltaTable(str(root / "dead_letter")).to_pyarrow_dataset()
    positions: set[tuple[int, int]] = set()
    prefixes: list[bytes] = []
    lengths: set[int] = set()
    for batch in dataset.to_batches(columns=["partition", "offset", "value"], batch_size=64):
        positions |= set(
            zip(batch["partition"].to_pylist(), batch["offset"].to_pylist(), strict=True)
        )
        lengths |= set(pc.binary_length(batch["value"]).to_pylist())
        prefixes += pc.binary_slice(batch["value"], 0, 8).to_pylist()
    assert len(prefixes) == len(positions) == RECORDS
    assert lengths == {SIZE}
    assert set(prefixes) == {f"{i:08d}".encode() for i in range(RECORDS)}
    ledger = DeltaTable(str(root / "_ledger")).to_pyarrow_table().to_pylist()
    batches = [r for r in ledger if r["entry_type"] == "batch"]
    assert sum(r["dead_lettered"] for r in batches) == RECORDS
    assert sum(r["records_in"] for r in batches) == RECORDS
