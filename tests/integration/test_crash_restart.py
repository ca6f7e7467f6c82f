"""Kill the driver (the whole process group, as a machine failure would) at the
points where a crash is most dangerous, rerun, and demand exact results."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from deltalake import DeltaTable

from jobs.settings import REPO_ROOT
from tests.conftest import pipeline_file, produce, run_with_fault
from tests.expected import clicks_per_window, state_as_counter

pytestmark = pytest.mark.integration
BAD = [b"broken", b'{"user_id": "z"}']


@pytest.mark.parametrize(
    "fault",
    [
        "after_changelog@1",  # changelog committed, state merge not yet
        "after_ledger@1",  # every table committed, Spark's own batch commit not yet
        "during_read",  # a source task is half-way through its range
        "after_dead_letter@0",
    ],
)
def test_crash_and_restart_is_exact(broker, kafka_config, new_topic, tmp_path, fault) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(3)
    now = int(time.time())
    values = [
        json.dumps({"user_id": f"u{i % 23}", "timestamp": now - 300 + i % 240}).encode()
        for i in range(2000)
    ] + BAD
    produce(kafka_config, topic, values)
    # At most 700 records per batch: several batches per run.
    pipeline = pipeline_file(tmp_path, "user_clicks", topic, max_offsets_per_trigger=700)
    warehouse = tmp_path / "warehouse"

    assert run_with_fault(pipeline, broker.bootstrap_servers, warehouse, fault) == -9
    assert run_with_fault(pipeline, broker.bootstrap_servers, warehouse, None) == 0

    root = warehouse / "user_clicks"
    expected, dead, late = clicks_per_window([values])
    assert late == 0
    state = DeltaTable(str(root / "state")).to_pyarrow_table().to_pylist()
    assert state_as_counter(state, "clicks") == expected

    changelog = DeltaTable(str(root / "changelog")).to_pyarrow_table().to_pylist()
    keys = [(r["user_id"], r["window_start"], r["epoch"], r["batch_id"]) for r in changelog]
    assert len(keys) == len(set(keys)), "duplicate changelog rows"
    ledger = DeltaTable(str(root / "_ledger")).to_pyarrow_table().to_pylist()
    batches = [(r["epoch"], r["batch_id"]) for r in ledger]
    assert len(batches) == len(set(batches)), "a batch is in the ledger twice"
    assert sum(r["records_in"] for r in ledger) == len(values)
    dead_letters = DeltaTable(str(root / "dead_letter")).to_pyarrow_table().to_pylist()
    assert sorted(d["value"] for d in dead_letters) == sorted(BAD)
    assert len(dead_letters) == dead

    status = subprocess.run(
        [sys.executable, "-m", "jobs", "status", "--pipeline", str(pipeline), "--json"]
        + ["--bootstrap-servers", broker.bootstrap_servers]
        + ["--warehouse", str(warehouse)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    report = json.loads(status.stdout)
    assert report["problems"] == []
    assert all(p["lag"] == 0 for p in report["partitions"])
