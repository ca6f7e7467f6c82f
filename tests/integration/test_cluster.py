"""The job on a real Spark standalone cluster (one master, one worker, loopback):
executors import ``jobs`` only from the zip the driver ships, run the Python the
setting names, and the results stay exact through a SIGKILL, a rebuild (whose
restart reads the seed on the executors) and a backfill. The warehouse is on the
S3 server: the executors share no disk with the driver (their staged files, the
checkpoint and the seed go through the bucket). (A plain restart after a kill is
the same code on any master: tests/integration/test_crash_restart.py.)"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from deltalake import DeltaTable

from include import local_spark
from tests.conftest import (
    QUICK_JIT,
    lease_expiry_s,
    pipeline_file,
    produce,
    run_jobs,
    run_with_fault,
)
from tests.conftest import recent_clicks as clicks
from tests.expected import clicks_per_window, state_as_counter

pytestmark = pytest.mark.integration
BAD = [b"not json", b'{"user_id": 7, "timestamp": 1}']
# The executors' JVMs on the JIT's first tier, as every other JVM of the suite.
QUICK_EXECUTORS = f"--conf spark.executor.extraJavaOptions='{QUICK_JIT}' pyspark-shell"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[local_spark.Cluster]:
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setenv("SPARK_DAEMON_JAVA_OPTS", QUICK_JIT)  # the master's and worker's
    started = local_spark.start(tmp_path_factory.mktemp("spark-cluster"), cores=2, memory="2g")
    monkeypatch.undo()
    yield started
    local_spark.stop(started)


def test_user_clicks_on_a_standalone_cluster(  # type: ignore[no-untyped-def]
    cluster, broker, kafka_config, new_topic, settings, tmp_path, s3_warehouse, monkeypatch
) -> None:
    settings = dataclasses.replace(settings, warehouse=s3_warehouse)
    monkeypatch.setenv("PLATFORM_LEASE_SECONDS", "2")  # the killed run's lease: 2-4 s
    # The executors' Python is the setting; nothing of the driver's path leaks to them.
    env = {
        "PLATFORM_SPARK_MASTER": cluster.master_url,
        "PLATFORM_SPARK_PYTHON": sys.executable,
        "PYSPARK_SUBMIT_ARGS": QUICK_EXECUTORS,
    }
    topic = new_topic(3)
    first = clicks(1800, 0) + BAD
    produce(kafka_config, topic, first)
    pipeline = pipeline_file(tmp_path, "user_clicks", topic, max_offsets_per_trigger=1000)
    servers, warehouse = broker.bootstrap_servers, settings.warehouse

    # Killed after batch 1's changelog commit (driver side); the Spark state is then
    # restored from Delta in a new epoch (the next run reads the seed on the
    # executors), and that run also picks up what the killed one left undone.
    assert run_with_fault(pipeline, servers, warehouse, "after_changelog@1", env=env) == -9
    time.sleep(lease_expiry_s())  # its lease expires (it was killed), then is taken over
    rebuilt = run_jobs(pipeline, settings, "rebuild", "--reason", "cluster test", env=env)
    assert rebuilt.returncode == 0, rebuilt.stderr[-3000:]
    second = clicks(900, 5)
    produce(kafka_config, topic, second)
    assert run_with_fault(pipeline, servers, warehouse, None, env=env) == 0
    expected, dead, late = clicks_per_window([first, second])
    assert late == 0
    assert current_state(warehouse) == expected
    executors = list(Path(cluster.directory, "work").glob("app-*/*/jobs-*.zip"))
    assert executors, "the executors never received the package"

    # Recomputed in batch on the cluster and published: the same exact answer.
    backfill = run_jobs(
        pipeline, settings, "backfill", "--from-earliest", "--reason", "cluster test", env=env
    )
    assert backfill.returncode == 0, backfill.stderr[-3000:]
    assert current_state(warehouse) == expected  # (the seeded restart ran after the rebuild)
    ledger = DeltaTable(str(warehouse / "user_clicks" / "_ledger")).to_pyarrow_table().to_pylist()
    batches = [r for r in ledger if r["entry_type"] == "batch"]
    assert len({(r["epoch"], r["batch_id"]) for r in batches}) == len(batches)
    letters = DeltaTable(str(warehouse / "user_clicks" / "dead_letter")).to_pyarrow_table()
    assert sorted(letters.column("value").to_pylist()) == sorted(BAD)
    assert letters.num_rows == dead


def current_state(warehouse: Path):  # type: ignore[no-untyped-def]
    rows = DeltaTable(str(warehouse / "user_clicks" / "state")).to_pyarrow_table().to_pylist()
    return state_as_counter(rows, "clicks")


def test_a_worker_python_that_cannot_run_the_tasks_is_one_error(  # type: ignore[no-untyped-def]
    cluster, broker, kafka_config, new_topic, settings, tmp_path
) -> None:
    topic = new_topic(1)
    produce(kafka_config, topic, clicks(10, 0))
    pipeline = pipeline_file(tmp_path, "user_clicks", topic)
    # A worker Python without obstore (which the tasks' staged files need): a wrapper
    # that puts a stand-in first on the path, as if the package were not installed.
    shadow = tmp_path / "shadow" / "obstore"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'obstore'\", name='obstore')\n"
    )
    python = tmp_path / "python-without-obstore"
    python.write_text(
        f'#!/bin/sh\nexport PYTHONPATH="{shadow.parent}:$PYTHONPATH"\nexec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    cases = {str(python): "has no module 'obstore'", str(tmp_path / "no-such-python"): "cannot run"}
    for worker_python, reason in cases.items():
        env = {
            "PLATFORM_SPARK_MASTER": cluster.master_url,
            "PLATFORM_SPARK_PYTHON": worker_python,
            "PYSPARK_SUBMIT_ARGS": QUICK_EXECUTORS,
        }
        failed = run_jobs(pipeline, settings, "run", env=env)
        # The platform's line (Spark's JVM prints its start-up notices before it).
        errors = [line for line in failed.stderr.splitlines() if line.startswith("error:")]
        assert failed.returncode == 2, failed.stderr[-3000:]
        assert len(errors) == 1, failed.stderr[-3000:]
        assert reason in errors[0] and "PLATFORM_SPARK_PYTHON" in errors[0], errors[0]
        assert "Traceback" not in failed.stderr, failed.stderr[-3000:]
        assert not (settings.warehouse / "user_clicks" / "_ledger").exists()
