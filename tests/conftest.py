"""Shared fixtures: one real broker and one SparkSession for the whole run."""

from __future__ import annotations

import atexit
import dataclasses
import io
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
import yaml

from jobs import broker as embedded
from jobs import kafka_admin, storage_server
from jobs.broker import BrokerInfo
from jobs.local_server import find_free_port
from jobs.settings import REPO_ROOT, Settings, lease_seconds, load_settings
from jobs.storage_server import StorageInfo
from jobs.streaming.jvm import EXTRA_ENV as JVM_OPTIONS_ENV
from jobs.warehouse import Location

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# Airflow: a private home (SQLite, logs) per test process, removed at its exit;
# each xdist worker makes its own (workers inherit the controller's environment).
# The plugins folder is importable as it is inside Airflow.
_MADE_HOME = "PLATFORM_TESTS_AIRFLOW_HOME"
if "AIRFLOW_HOME" not in os.environ or (
    os.environ.get("PYTEST_XDIST_WORKER")
    and os.environ["AIRFLOW_HOME"] == os.environ.get(_MADE_HOME)
):
    _home = tempfile.mkdtemp(prefix="airflow-home-")
    os.environ["AIRFLOW_HOME"] = os.environ[_MADE_HOME] = _home
    atexit.register(shutil.rmtree, _home, ignore_errors=True)
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(REPO_ROOT / "dags"))
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "True")
sys.path.insert(0, str(REPO_ROOT / "plugins"))
# Every JVM of the suite (the shared session, the job processes, the brokers and
# Kafka's tools) on the JIT's first tier: a cold 2,000-record run 20.4 -> 16.0 s,
# a broker start 3.6 -> 2.7 s, two test files on the two workers 264 -> 226 s
# (docs/benchmarks.md). The code cache is larger than the first tier's 48 MB, which
# the shared session would fill within minutes (compilation then stops).
QUICK_JIT = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=256m"
os.environ.setdefault(JVM_OPTIONS_ENV, QUICK_JIT)
os.environ.setdefault(embedded.EXTRA_ENV, QUICK_JIT)
_topic_ids = itertools.count()


def _commit_parity() -> int:
    """0 or 1 by the checked-out commit (the same in every xdist worker)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        head = ""
    return int(head[-1], 16) % 2 if re.fullmatch(r"[0-9a-f]{40}", head) else 0


ROTATION = _commit_parity()


def rotating(items: list[Any]) -> list[Any]:
    """Every other item of a fixed list of seeds or cases, alternately by the commit
    (CI runs each item at least every second commit, within its 30 minutes); all of
    them with PLATFORM_TESTS_ALL=1 (a long run)."""
    if os.environ.get("PLATFORM_TESTS_ALL"):
        return list(items)
    return list(items)[ROTATION::2]


# ``make test`` runs four workers on the two cores (the suite mostly waits: on
# Kafka, Airflow, a lease, a killed process; two workers left the cores 20% idle,
# three took 27:23 for 1,174 tests, four 25:52 for 1,185), a test file each at a
# time (``--dist loadfile``): the slowest files go first so that no long file starts
# last with the other workers idle (ordered by their measured time, longest first;
# the cluster test, whose executors load both cores, before the fencing tests).
SLOW_FIRST = (
    "test_repair_sequences.py",  # with its seeds on S3, the longest file (~9 min)
    "test_replicated_cluster.py",
    "test_stream_pauses.py",  # every batch point in one sequence (~5 min)
    "test_crash_restart.py",
    "test_cluster.py",
    "test_operations.py",
    "test_operation_pauses.py",
    "test_interrupted_operations.py",
    "test_airflow_ui.py",
    "test_backfill.py",
    "test_store_faults.py",
    "test_backfill_memory.py",
    "test_repair_lineage.py",
    "test_hopping_repairs.py",
    "test_warm_driver.py",
    "test_stream_dag_run.py",
    "test_metrics.py",
    "test_sql_pipelines.py",
    "test_bad_input.py",
    "test_maintain.py",
    "test_dead_letter_memory.py",
    "test_end_to_end.py",
    "test_kafka_credentials.py",
    "test_distributed_writes.py",
    "test_delta_engines.py",
    "test_fuzz_records.py",
    "test_monitoring_group.py",
)


# A test that starts a server (the broker, Spark, Airflow, a browser) is an
# integration test; ``make unit`` runs the others.
SERVER_FIXTURES = {
    "broker",
    "spark",
    "settings",
    "kafka_config",
    "new_topic",
    "clicks_app",
    "s3_server",
}
SERVER_FILES = {"test_stream_dag_run.py"}  # runs a DAG's tasks: Spark


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_FIRST)))  # stable
    for item in items:
        in_folder = item.path.parent.name in ("integration", "ui")
        if in_folder or _uses_a_server(item) or item.path.name in SERVER_FILES:
            item.add_marker(pytest.mark.integration)


def _uses_a_server(item: pytest.Item) -> bool:
    """Whether the test uses this module's server fixtures (a test module may define
    a fixture of the same name, e.g. ``settings``, that starts none)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(
        definitions[-1].func.__module__ == __name__
        for name, definitions in info.name2fixturedefs.items()
        if name in SERVER_FIXTURES and definitions
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Under CI a skip is a failure that says why: a test whose server could not be
    installed or started must not pass the run unseen."""
    outcome = yield
    report = outcome.get_result()
    under_ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    if under_ci and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped under CI (CI is set), which counts as a failure: {reason}"


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerInfo]:
    data_dir = tmp_path_factory.mktemp("broker")
    info = embedded.start(data_dir, embedded.find_free_port())
    yield info
    embedded.stop(data_dir)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StorageInfo]:
    """The embedded S3 server (SeaweedFS), one per test process; tests keep apart
    by prefix (``s3_warehouse``)."""
    data_dir = tmp_path_factory.mktemp("storage")
    info = storage_server.start(data_dir, find_free_port(19400, 19900))
    yield info
    storage_server.stop(data_dir)


@pytest.fixture
def s3_warehouse(
    s3_server: StorageInfo, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> Location:
    """A warehouse of its own on the S3 server, with the AWS variables set for this
    test (and the processes it starts)."""
    for name, value in s3_server.environment().items():
        monkeypatch.setenv(name, value)
    name = re.sub(r"[^A-Za-z0-9_-]", "-", request.node.name)[:60]
    return Location.parse(f"{s3_server.warehouse}/{name}-{next(_topic_ids)}")


@pytest.fixture(scope="session")
def spark(s3_server: StorageInfo):  # type: ignore[no-untyped-def]
    """The shared session, started with this process's S3 server in its environment:
    its Python workers (which write staged files to S3) inherit the JVM's."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in s3_server.environment().items():
            patch.setenv(name, value)
        session = long_lived_session("tests")
        yield session
        session.stop()


def long_lived_session(name: str) -> Any:
    """A session for many jobs."""
    from jobs.streaming.spark import get_spark

    return get_spark("local[2]", name)


@pytest.fixture
def settings(broker: BrokerInfo, tmp_path: Path) -> Settings:
    return dataclasses.replace(
        load_settings(),
        bootstrap_servers=broker.bootstrap_servers,
        warehouse=tmp_path / "warehouse",
    )


@pytest.fixture
def kafka_config(broker: BrokerInfo) -> dict[str, str]:
    return kafka_admin.client_config(broker.bootstrap_servers)


@pytest.fixture
def new_topic(kafka_config: dict[str, str]):  # type: ignore[no-untyped-def]
    """Creates a uniquely named topic: ``new_topic(partitions=4)`` -> name."""

    def make(partitions: int = 4, config: dict[str, str] | None = None) -> str:
        name = f"t{os.getpid()}_{next(_topic_ids)}_{int(time.time() * 1000) % 10**6}"
        kafka_admin.create_topic(kafka_admin.admin(kafka_config), name, partitions, config)
        return name

    return make


@dataclasses.dataclass(frozen=True)
class ClicksApp:
    """``user_clicks`` reading a topic of its own: the setup the operations tests
    share (``clicks_app``). ``feed`` produces events and runs the stream over them."""

    topic: str
    path: Path
    pipeline: Any  # jobs.pipeline.model.Pipeline
    settings: Settings
    kafka_config: dict[str, str]
    session: Callable[[], Any]  # the shared SparkSession, started on first use

    def produce(self, events: list[bytes]) -> list[bytes]:
        produce(self.kafka_config, self.topic, list(events))
        return events

    def run(self) -> Any:  # jobs.streaming.run.RunSummary
        from jobs.streaming.run import run_pipeline

        return run_pipeline(self.session(), self.pipeline, self.settings)

    def feed(self, events: list[bytes]) -> list[bytes]:
        self.produce(events)
        self.run()
        return events


@pytest.fixture
def clicks_app(request, settings, kafka_config, new_topic, tmp_path):  # type: ignore[no-untyped-def]
    """``clicks_app(partitions, output=True, **source)`` -> a ``ClicksApp`` on a new
    topic (publishing to ``out_<topic>`` with ``output``)."""
    from jobs.pipeline.parser import load_pipeline
    from tests.output_topic import with_output

    def make(partitions: int = 1, output: bool = False, **source: object) -> ClicksApp:
        topic = new_topic(partitions)
        path = pipeline_file(tmp_path, "user_clicks", topic, **source)
        if output:
            with_output(path, f"out_{topic}")
        pipeline = load_pipeline(str(path), tmp_path)
        session = lambda: request.getfixturevalue("spark")  # noqa: E731
        return ClicksApp(topic, path, pipeline, settings, kafka_config, session)

    return make


def produce(
    config: dict[str, str], topic: str, values: list[bytes | None], key: bytes | None = None
) -> None:
    now_ms = int(time.time() * 1000)
    kafka_admin.produce_all(config, topic, ((key, v, now_ms) for v in values))  # type: ignore[misc]


def recent_clicks(n: int, salt: int, users: int = 17) -> list[bytes]:
    """``user_clicks`` events of the last few minutes (inside the watermark), spread
    over ``users`` users; ``salt`` makes another set."""
    now = int(time.time())
    return [
        json.dumps(
            {"user_id": f"u{(i * 7 + salt) % users}", "timestamp": now - 280 + i % 240}
        ).encode()
        for i in range(n)
    ]


def pipeline_file(directory: Path, name: str, topic: str, **source: object) -> Path:
    """A copy of a reference pipeline reading ``topic`` (and other source settings)."""
    data = yaml.safe_load((REPO_ROOT / "include" / "pipelines" / f"{name}.yaml").read_text())
    data["source"].update({"topics": [topic], **source})
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def jobs_args(pipeline: Path, servers: str, warehouse: Path | Location, *args: str) -> list[str]:
    """``python -m jobs``'s arguments for ``args`` on ``pipeline`` against a broker and
    a warehouse (for a process or for ``run_in_process``)."""
    return [*args, "--pipeline", str(pipeline)] + [
        "--bootstrap-servers",
        servers,
        "--warehouse",
        str(warehouse),
    ]


def run_jobs(
    pipeline: Path,
    settings: Settings,
    *args: str,
    env: dict[str, str] | None = None,
    spark: Any = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """``python -m jobs <args> --pipeline <file>`` against the test broker and warehouse:
    in a new process (``env``: extra environment, e.g. a cluster's
    PLATFORM_SPARK_MASTER), or with ``spark`` in this one, on that session
    (``jobs.cli.main`` under ``hosted_by``: the same command without a second
    Spark's start-up)."""
    argv = jobs_args(pipeline, settings.bootstrap_servers, settings.warehouse, *args)
    if spark is not None:
        assert env is None, "an in-process command runs in this process's environment"
        return run_in_process(spark, argv)
    return subprocess.run(
        [sys.executable, "-m", "jobs", *argv],
        cwd=REPO_ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        start_new_session=True,  # its own process group: a PLATFORM_FAULT kills only it
    )


def run_in_process(spark: Any, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``jobs.cli.main(argv)`` on ``spark``: exit code, stdout and stderr as a
    process's (Spark's own JVM output is not in them)."""
    from jobs.cli import main
    from jobs.streaming.spark import hosted_by

    assert "PLATFORM_FAULT" not in os.environ, "a fault kills the process: use a subprocess"
    out, err = io.StringIO(), io.StringIO()
    with hosted_by(spark), redirect_stdout(out), redirect_stderr(err):
        code = main(argv)
    return subprocess.CompletedProcess(["jobs", *argv], code, out.getvalue(), err.getvalue())


def continuous_pipeline(directory: Path, name: str, topic: str, **source: object) -> Path:
    """``pipeline_file`` with a continuous 1 s trigger."""
    path = pipeline_file(directory, name, topic, **source)
    data = yaml.safe_load(path.read_text())
    data["trigger"] = {"mode": "continuous", "interval": "1 second"}
    path.write_text(yaml.safe_dump(data))
    return path


def start_stream(
    pipeline: Path, settings: Settings, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """``python -m jobs run`` of ``pipeline`` in its own session (the caller stops it
    with SIGTERM and reads its output)."""
    return subprocess.Popen(
        [sys.executable, "-m", "jobs"]
        + jobs_args(pipeline, settings.bootstrap_servers, settings.warehouse, "run", "--quiet"),
        cwd=REPO_ROOT,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_out_a_killed_lease(warehouse: Path | Location) -> None:
    """On object storage a killed holder's lease holds until it expires (the next
    command is refused as busy until then, and takes it over after watching it
    unrenewed for its time to live); locally its flock went with it. Its age is the
    store's, whose times are whole seconds (``lease.STORE_TIME_GRAIN_S``)."""
    if Location.parse(str(warehouse)).is_s3:
        time.sleep(lease_expiry_s())


def lease_expiry_s() -> float:
    """How long after a holder is killed its lease reads as free (its time to live,
    the store's one-second grain, and a margin)."""
    from jobs.lease import STORE_TIME_GRAIN_S

    return lease_seconds() + STORE_TIME_GRAIN_S + 0.5


def run_with_fault(
    pipeline: Path,
    servers: str,
    warehouse: Path | Location,
    fault: str | None,
    *extra: str,
    env: dict[str, str] | None = None,
    spark: Any = None,
) -> int:
    """``python -m jobs run`` in its own process group, killed at ``fault``
    (``PLATFORM_FAULT``, see ``jobs/faults.py``) if one is given: returns 0 or -9.
    Without a fault and with ``spark``, the run is in this process, on that session
    (a recovery need not be a new process: what it recovers from is on disk). After a
    kill, the killed run's lease on object storage is waited out."""
    argv = jobs_args(pipeline, servers, warehouse, "run", "--quiet", *extra)
    if fault is None and spark is not None and env is None:
        done = run_in_process(spark, argv)
        if done.returncode != 0:
            raise AssertionError(done.stderr[-3000:])
        return 0
    environment = {k: v for k, v in os.environ.items() if k != "PLATFORM_FAULT"}
    environment.update(env or {})
    if fault:
        environment["PLATFORM_FAULT"] = fault
    proc = subprocess.run(
        [sys.executable, "-m", "jobs", *argv],
        cwd=REPO_ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
        start_new_session=True,  # its own process group: the fault kills only the job
    )
    if proc.returncode not in (0, -9):
        raise AssertionError(proc.stderr[-3000:])
    if proc.returncode == -9:
        wait_out_a_killed_lease(warehouse)
    return proc.returncode
