"""Chaos: a continuous run under a live producer, SIGKILLed, a
broker restart under it, and a deleted Spark checkpoint repaired with ``rebuild``.
The result must be exact against plain Python over what was produced, and the
ledger's offset ranges must tile every partition with no gap and no overlap.

The test runs its own broker (it restarts it) on its own data directory.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from jobs import broker as embedded
from jobs import kafka_admin
from jobs.settings import REPO_ROOT
from tests.conftest import jobs_args, run_in_process
from tests.live import (
    LiveProducer,
    assert_exact_clicks,
    assert_ledger_tiles,
    jobs_cmd,
    kill,
    ledger_batches,
    start_stream,
    wait_for_batches,
)

pytestmark = pytest.mark.integration
PARTITIONS = 3


def test_chaos_live_producer_kills_broker_restart_and_lost_checkpoint(
    spark, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    data_dir = tmp_path / "broker"
    port = embedded.find_free_port(13000, 14000)
    info = embedded.start(data_dir, port)
    servers = info.bootstrap_servers
    config = kafka_admin.client_config(servers)
    topic = f"chaos_{os.getpid()}"
    kafka_admin.create_topic(kafka_admin.admin(config), topic, PARTITIONS, {"retention.ms": "-1"})
    data = yaml.safe_load((REPO_ROOT / "include" / "pipelines" / "user_clicks.yaml").read_text())
    data["source"].update({"topics": [topic], "max_offsets_per_trigger": 700})
    data["trigger"] = {"mode": "continuous", "interval": "1 second"}
    path = tmp_path / "user_clicks.yaml"
    path.write_text(yaml.safe_dump(data))
    warehouse = tmp_path / "warehouse"
    producer = LiveProducer(config, topic)
    producer.start()
    stream = start_stream(path, servers, warehouse)
    try:
        # The broker restarts under the running stream (SIGTERM: it keeps its data);
        # the stream is then SIGKILLed, and again at a random moment further on.
        wait_for_batches(warehouse, len(ledger_batches(warehouse)))
        producer.pause()
        embedded.stop(data_dir)
        time.sleep(2)
        embedded.start(data_dir, port)
        producer.resume()
        kill(stream)  # it may have died on the broker's absence; either way restart it
        stream = start_stream(path, servers, warehouse)
        wait_for_batches(warehouse, len(ledger_batches(warehouse)))

        # The Spark checkpoint is lost while the stream is down: rebuild from Delta.
        kill(stream)
        shutil.rmtree(warehouse / "user_clicks" / "_checkpoints")
        rebuilt = subprocess.run(
            jobs_cmd(path, servers, warehouse, "rebuild", "--reason", "checkpoint lost"),
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert rebuilt.returncode == 0, rebuilt.stderr[-3000:]
        # (A stream killed at a random moment: tests/integration/test_replicated_cluster.py.)
    finally:
        producer.stopped.set()
        producer.join(60)
        if stream.poll() is None:
            os.killpg(stream.pid, signal.SIGKILL)
    assert producer.error is None, producer.error

    try:
        # The catch-up needs no process of its own: what it recovers from is on disk.
        command = jobs_args(
            path, servers, warehouse, "run", "--trigger", "available-now", "--quiet"
        )
        caught_up = run_in_process(spark, command)
        assert caught_up.returncode == 0, caught_up.stderr[-3000:]
        marks = kafka_admin.watermarks(config, [(topic, p) for p in range(PARTITIONS)])
    finally:
        embedded.stop(data_dir)

    values = producer.values
    assert sum(high for _low, high in marks.values()) == len(values)
    assert_exact_clicks(warehouse, values)

    batches = ledger_batches(warehouse)
    assert len({b["epoch"] for b in batches}) >= 2  # the rebuild started a new epoch
    assert_ledger_tiles(batches, topic, {p: marks[(topic, p)][1] for p in range(PARTITIONS)})
    assert sum(b["records_in"] for b in batches) == len(values)
