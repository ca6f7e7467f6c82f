"""``dag.test()`` of stream_user_clicks: Airflow -> SparkSubmitOperator -> spark-submit
-> the job, against the embedded broker; the Delta state is checked in plain Python."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from deltalake import DeltaTable

from jobs.settings import REPO_ROOT, load_settings
from tests.conftest import pipeline_file, produce, run_jobs
from tests.expected import clicks_per_window, state_as_counter

pytestmark = pytest.mark.integration
APP = "clicks_on_s3"
SPARK_CONNECTION = "spark://local%5B2%5D?deploy-mode=client&spark-binary=spark-submit"


@pytest.fixture(scope="session")
def airflow_db() -> None:
    subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"],
        check=True,
        capture_output=True,
        timeout=300,
    )


def test_dag_test_of_stream_user_clicks(
    airflow_db, broker, kafka_config, new_topic, tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(2)
    now = int(time.time())
    values = [
        json.dumps({"user_id": f"u{i % 11}", "timestamp": now - 500 + i % 400}).encode()
        for i in range(1500)
    ] + [b"garbage"]
    produce(kafka_config, topic, values)
    pipelines = tmp_path / "pipelines"
    pipeline_file(pipelines, "user_clicks", topic)
    warehouse = tmp_path / "warehouse"
    bin_dir = str(Path(sys.executable).parent)
    # What the local Airflow sets: the platform's settings and the Spark connection.
    monkeypatch.setenv("PLATFORM_BOOTSTRAP_SERVERS", broker.bootstrap_servers)
    monkeypatch.setenv("PLATFORM_WAREHOUSE", str(warehouse))
    monkeypatch.setenv("PLATFORM_PIPELINES_DIR", str(pipelines))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", SPARK_CONNECTION)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(dag_folder=str(REPO_ROOT / "dags")).dags["stream_user_clicks"]
    run = dag.test(run_conf={"trigger": "available-now", "reason": "test"})
    assert str(run.state) in ("success", "DagRunState.SUCCESS"), run.state

    expected, dead, _late = clicks_per_window([values])
    state = DeltaTable(str(warehouse / "user_clicks" / "state")).to_pyarrow_table().to_pylist()
    assert state_as_counter(state, "clicks") == expected
    dead_letters = DeltaTable(str(warehouse / "user_clicks" / "dead_letter")).to_pyarrow_table()
    assert dead_letters.num_rows == dead == 1

    # The hook and the sensor read the same ledger.
    from platform_airflow.hooks import PlatformHook
    from platform_airflow.sensors import ApplicationHealthSensor

    health = PlatformHook().health("user_clicks")
    assert health["lag"] == 0 and health["problems"] == []
    assert 0 <= health["last_batch_age_s"] < 600
    fresh = ApplicationHealthSensor(task_id="fresh", pipeline="user_clicks", max_lag=0)
    assert fresh.poke({}) is True
    stale = ApplicationHealthSensor(task_id="stale", pipeline="user_clicks", max_batch_age_s=0)
    assert stale.poke({}) is False
    produce(kafka_config, topic, [b'{"user_id": "late", "timestamp": 1}'])
    lagging = ApplicationHealthSensor(task_id="lagging", pipeline="user_clicks", max_lag=0)
    assert lagging.poke({}) is False


def test_dag_run_on_object_storage_through_an_aws_connection(
    airflow_db, spark, broker, kafka_config, new_topic, s3_warehouse, tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """The warehouse on S3, its keys and endpoint only in an Airflow ``aws``
    connection (``PLATFORM_AWS_CONN_ID``): the job spark-submit starts and the
    hook's reads both reach the store through it; then a maintenance DAG (plan,
    approval, apply) repairs the application on the bucket."""
    topic = new_topic(2)
    now = int(time.time())
    values = [
        json.dumps({"user_id": f"u{i % 7}", "timestamp": now - 300 + i % 200}).encode()
        for i in range(400)
    ] + [b"garbage"]
    produce(kafka_config, topic, values)
    pipelines = tmp_path / "pipelines"
    # An application of its own: Airflow keeps the first test's assets of user_clicks
    # (on the local warehouse) active under their names until a scheduler orphans them.
    local = pipeline_file(pipelines, "user_clicks", topic)
    definition = yaml.safe_load(local.read_text())
    definition["application_id"] = APP
    (pipelines / f"{APP}.yaml").write_text(yaml.safe_dump(definition))
    local.unlink()
    store = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    for name in store:
        monkeypatch.delenv(name)  # the worker has no keys of its own
    monkeypatch.setenv(
        "AIRFLOW_CONN_WAREHOUSE_S3",
        json.dumps(
            {
                "conn_type": "aws",
                "login": store["AWS_ACCESS_KEY_ID"],
                "password": store["AWS_SECRET_ACCESS_KEY"],
                "extra": {"endpoint_url": store["AWS_ENDPOINT_URL"], "region_name": "us-east-1"},
            }
        ),
    )
    monkeypatch.setenv("PLATFORM_AWS_CONN_ID", "warehouse_s3")
    monkeypatch.setenv("PLATFORM_BOOTSTRAP_SERVERS", broker.bootstrap_servers)
    monkeypatch.setenv("PLATFORM_WAREHOUSE", str(s3_warehouse))
    monkeypatch.setenv("PLATFORM_PIPELINES_DIR", str(pipelines))
    monkeypatch.setenv("PLATFORM_DRIVER_URL", "off")
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", SPARK_CONNECTION)
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")

    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(dag_folder=str(REPO_ROOT / "dags")).dags[f"stream_{APP}"]
    run = dag.test(run_conf={"trigger": "available-now", "reason": "test"})
    assert str(run.state) in ("success", "DagRunState.SUCCESS"), run.state

    from platform_airflow.hooks import PlatformHook

    health = PlatformHook().health(APP)  # through the connection, in this process
    assert health["lag"] == 0 and health["problems"] == []
    expected, dead, _late = clicks_per_window([values])
    state = DeltaTable(str(s3_warehouse / APP / "state")).to_pyarrow_table().to_pylist()
    assert state_as_counter(state, "clicks") == expected
    dead_letters = DeltaTable(str(s3_warehouse / APP / "dead_letter"))
    assert dead_letters.to_pyarrow_table().num_rows == dead == 1
    # The metrics exporter reads the same ledger on the bucket.
    from tests.integration.test_metrics import run_exporter, total

    exported = run_exporter(load_settings())
    ledger = DeltaTable(str(s3_warehouse / APP / "_ledger")).to_pyarrow_table()
    batches = [r for r in ledger.to_pylist() if r["entry_type"] == "batch"]
    app = {"application": APP}
    assert total(exported, "platform_ledger_batches_total", app) == len(batches)
    assert total(exported, "platform_ledger_records_total", app) == len(values)

    # Maintenance from Airflow: plan -> approval -> apply in one run (a person's
    # approval is marked given here; tests/ui clicks it in the browser).
    rebuild = DagBag(dag_folder=str(REPO_ROOT / "dags")).dags["maintenance_rebuild"]
    applied = rebuild.test(
        run_conf={"pipeline": APP, "reason": "airflow rebuild"},
        mark_success_pattern="approval",
    )
    assert str(applied.state) in ("success", "DagRunState.SUCCESS")
    ledger = DeltaTable(str(s3_warehouse / APP / "_ledger")).to_pyarrow_table()
    audits = [json.loads(r["details"]) for r in ledger.to_pylist() if r["entry_type"] == "rebuild"]
    planned = [a for a in audits if a.get("dry_run")]
    done = [a for a in audits if a.get("phase") == "done"]
    assert len(planned) == 1 and len(done) == 1
    assert done[0]["plan"]["plan_id"] == planned[0]["plan"]["plan_id"]  # exactly the plan
    assert all(a["who"].startswith("airflow:") for a in audits)
    # The stream resumes in the new epoch with the same state plus new events (the
    # run itself in this process, with the store's keys: spark-submit was shown above).
    for name, value in store.items():
        monkeypatch.setenv(name, value)
    more = [json.dumps({"user_id": "u1", "timestamp": now - 100}).encode()] * 5
    produce(kafka_config, topic, more)
    again = run_jobs(pipelines / f"{APP}.yaml", load_settings(), "run", spark=spark)
    assert again.returncode == 0, again.stderr[-2000:]
    expected, _dead, _late = clicks_per_window([values, more])
    state = DeltaTable(str(s3_warehouse / APP / "state")).to_pyarrow_table().to_pylist()
    assert state_as_counter(state, "clicks") == expected
