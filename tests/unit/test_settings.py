"""Every ``PLATFORM_*`` variable the platform reads: a bad value is refused with one
``error:`` line that names the variable and the form it takes, before anything
starts (``jobs/settings.py``), never a traceback later."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from jobs import cli
from jobs.errors import ConfigError
from jobs.settings import ENV_NAMES, ENV_PREFIX, REPO_ROOT, load_settings

# Bad values of each variable: non-numeric, negative, out of range, malformed.
BAD: dict[str, list[str]] = {
    "PLATFORM_BOOTSTRAP_SERVERS": [
        "",
        "localhost",
        "a b:9092",
        "h:99999",
        "h:0",
        "h:-1",
        ",",
    ],
    "PLATFORM_WAREHOUSE": ["", str(REPO_ROOT / "README.md")],
    "PLATFORM_SPARK_MASTER": [
        "",
        "local[two]",
        "local[-1]",
        "spark:/h:7077",
        "lokal",
        "local[2,0]",
        "local-cluster[0,1,1024]",
        "local-cluster[1,1,0]",
    ],
    # Spark's driver needs 450 MiB of heap: less is refused when the session starts
    # and -Xmx2048 is bytes to the JVM, -Xmx2gb is refused by it
    "PLATFORM_SPARK_DRIVER_MEMORY": ["", "lots", "-1g", "2 g", "2q", "1k", "100m", "2048", "2gb"],
    "PLATFORM_SPARK_CDS": ["of", "yes please"],
    "PLATFORM_SPARK_JAVA_OPTIONS": ["TieredStopAtLevel=1", "-Dx='unclosed"],
    "PLATFORM_JARS_DIR": ["", str(REPO_ROOT / "README.md")],
    "PLATFORM_SPARK_CONN_ID": ["", "spark default", "spark/default"],
    "PLATFORM_PIPELINES_DIR": ["", str(REPO_ROOT / "README.md")],
    "PLATFORM_DIMENSIONS_DIR": ["", str(REPO_ROOT / "README.md")],
    "PLATFORM_BROKER_DATA_DIR": ["", str(REPO_ROOT / "README.md")],
    "PLATFORM_BROKER_PORT": ["", "http", "-1", "0", "65536", "1e3"],
    "PLATFORM_BROKER_JAVA_OPTIONS": ["Xmx1g", '-Dx="unclosed'],
    "PLATFORM_STORAGE_DATA_DIR": ["", str(REPO_ROOT / "README.md")],
    "PLATFORM_STORAGE_PORT": ["", "s3", "-1", "0", "65536"],
    "PLATFORM_LEASE_SECONDS": ["", "x", "0", "0.5", "601", "nan", "inf"],
    "PLATFORM_AWS_CONN_ID": ["a b", "x/y", "é"],
    "PLATFORM_AIRFLOW_HOME": ["", str(REPO_ROOT / "README.md")],
    "PLATFORM_AIRFLOW_PORT": ["x", "-8085", "99999"],
    "PLATFORM_DRIVER_URL": [
        "of",
        "http://127.0.0.1:99999",
        "http://127.0.0.1:0",
        "http://127.0.0.1:-1",
        "http://127.0.0.1:port",
        "http://10.0.0.1:18090",
        "https://127.0.0.1:18090",
        "http://[::1]:18090",  # the driver listens on 127.0.0.1 only
    ],
    "PLATFORM_DRIVER_PORT": ["x", "-1", "0", "70000"],
    "PLATFORM_DRIVER_TOKEN": ["two words", "tab\there", "\u00e9t\u00e9"],
    "PLATFORM_METRICS_PORT": ["x", "-1", "65536"],
    "PLATFORM_METRICS_ADDRESS": ["localhost", "256.0.0.1"],
    "PLATFORM_PUSHGATEWAY_URL": [
        "pushgateway:9091",
        "http://h:99999",
        "http://h:0",
        "ftp://h",
        "http://:9091",
        "http://...:9091",
        "http://-",
        "http://h..x:9091",
    ],
    "PLATFORM_APPROVERS": ["bob smith", "alice,bob smith"],
    "PLATFORM_DIMENSION_MAX_BYTES": ["x", "-1", "0", "2g", "64 m"],
    "PLATFORM_OUTAGE_WAIT_SECONDS": ["x", "-5", "604801", "1.5"],
    "PLATFORM_DRIVER_TRAIN_EVENTS": ["x", "-1", "50000001", "1e6", "1,000"],
    "PLATFORM_FAULT": ["after_changelog@x", "after_changelog@-1", "no_such_point", "@3"],
    "PLATFORM_PAUSE": ["before_bump@x", "nowhere", "@1"],
}
# Any value is a good one: a command (the executors' Python) or a name.
FREE_TEXT = {"PLATFORM_SPARK_PYTHON", "PLATFORM_TRIGGERED_BY"}
CASES = [(name, value) for name, values in BAD.items() for value in values]
# Read and written by the platform itself (the fault's process group and driver), and the
# test suite's own; PLATFORM_KAFKA_* are Kafka client settings (jobs/kafka_settings.py).
NOT_SETTINGS = {"PLATFORM_FAULT_PGID", "PLATFORM_FAULT_DRIVER", "PLATFORM_TESTS_AIRFLOW_HOME"}
MENTIONED = re.compile(r"\bPLATFORM_[A-Z0-9_]*[A-Z0-9](?![A-Z0-9_]*\*)")


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)


def test_every_variable_is_checked_here() -> None:
    assert set(BAD) | FREE_TEXT == set(ENV_NAMES)
    sources = [
        *(REPO_ROOT / "jobs").rglob("*.py"),
        *(REPO_ROOT / "plugins").rglob("*.py"),
        *(REPO_ROOT / "include").rglob("*.py"),
    ]
    mentioned = {name for path in sources for name in MENTIONED.findall(path.read_text())}
    read = {n for n in mentioned if not n.startswith(ENV_PREFIX + "KAFKA")} - NOT_SETTINGS
    assert read <= set(ENV_NAMES), read - set(ENV_NAMES)


def test_the_defaults_are_good() -> None:
    load_settings()


@pytest.mark.parametrize(("name", "value"), CASES)
def test_a_bad_value_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as refused:
        load_settings()
    message = str(refused.value)
    assert message.startswith(f"{name} must be "), message
    assert repr(value) in message and "\n" not in message


@pytest.mark.parametrize(("name", "value"), CASES)
def test_the_command_line_says_it_in_one_error_line(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    name: str,
    value: str,
) -> None:
    monkeypatch.setenv(name, value)
    code = cli.main(["broker", "status", "--data-dir", str(tmp_path)])
    captured = capsys.readouterr()
    assert code == 2, captured
    assert captured.err.startswith(f"error: {name} must be ")
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err
    assert captured.out == ""


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("PLATFORM_BOOTSTRAP_SERVERS", "kafka-1:9092,kafka-2:9092, [::1]:19092"),
        ("PLATFORM_SPARK_MASTER", "local"),
        ("PLATFORM_SPARK_MASTER", "local[*]"),
        ("PLATFORM_SPARK_MASTER", "local[4,2]"),
        ("PLATFORM_SPARK_MASTER", "spark://spark-master:7077"),
        ("PLATFORM_SPARK_MASTER", "yarn"),
        ("PLATFORM_SPARK_MASTER", "k8s://https://10.0.0.1:443"),
        ("PLATFORM_SPARK_DRIVER_MEMORY", "512m"),
        ("PLATFORM_SPARK_DRIVER_MEMORY", "2G"),
        ("PLATFORM_SPARK_DRIVER_MEMORY", "1t"),
        ("PLATFORM_SPARK_MASTER", "local-cluster[2,1,1024]"),
        ("PLATFORM_PUSHGATEWAY_URL", "http://10.0.0.7:9091"),
        ("PLATFORM_PUSHGATEWAY_URL", "http://push-gw.monitoring.svc"),
        ("PLATFORM_PUSHGATEWAY_URL", "http://push-gw.example.com.:9091"),
        ("PLATFORM_SPARK_CDS", "off"),
        ("PLATFORM_SPARK_CDS", "on"),
        ("PLATFORM_SPARK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=256m"),
        ("PLATFORM_SPARK_JAVA_OPTIONS", "-Dname='two words'"),
        ("PLATFORM_BROKER_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1"),
        ("PLATFORM_SPARK_CONN_ID", "spark_default"),
        ("PLATFORM_WAREHOUSE", "/data/warehouse"),
        ("PLATFORM_DRIVER_TOKEN", "x"),
        ("PLATFORM_DRIVER_URL", "off"),
        ("PLATFORM_DRIVER_URL", ""),
        ("PLATFORM_PUSHGATEWAY_URL", "http://pushgateway:9091"),
        ("PLATFORM_PUSHGATEWAY_URL", "https://[::1]:9091/"),
        ("PLATFORM_FAULT", "after_changelog"),
        ("PLATFORM_FAULT", "after_changelog@3"),
        ("PLATFORM_PAUSE", "before_bump"),
        ("PLATFORM_PAUSE", "after_state@2"),
        # What Kafka's clients and the java launcher take (a review found them refused).
        ("PLATFORM_BOOTSTRAP_SERVERS", "kafka_1:9092,kafka_2:9092"),
        ("PLATFORM_BOOTSTRAP_SERVERS", "k:9092,"),
        ("PLATFORM_SPARK_JAVA_OPTIONS", "--add-opens java.base/java.nio=ALL-UNNAMED -Xss4m"),
    ],
)
def test_good_values_are_taken(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    load_settings()


@pytest.mark.parametrize(
    "command",
    [["include.local_airflow", "status"], ["include.sample_data", "clicks", "--count", "1"]],
)
def test_the_tools_in_include_say_it_in_one_error_line(command: list[str]) -> None:
    """They read the settings too (local_airflow did at import: a traceback)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PLATFORM_AIRFLOW_PORT": "99999"}
    result = subprocess.run(
        [sys.executable, "-m", *command],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert (
        result.stderr == "error: PLATFORM_AIRFLOW_PORT must be a port number 1-65535, got '99999'\n"
    )


def test_a_warehouse_is_a_local_folder_or_an_s3_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLATFORM_WAREHOUSE", "s3a://warehouse/prefix")
    assert load_settings().warehouse.uri == "s3://warehouse/prefix"
    assert load_settings().warehouse.spark_uri == "s3a://warehouse/prefix"
    monkeypatch.setenv("PLATFORM_WAREHOUSE", "gs://bucket/prefix")
    with pytest.raises(ConfigError, match=r"use a local path or s3://bucket/prefix"):
        load_settings()
