"""The warm driver (``python -m jobs serve``): runs sent to it are the same runs,
exact across runs in one JVM and across the driver's death mid-batch; bad requests
are refused with one error line."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from deltalake import DeltaTable

from jobs.delta.layout import AppLayout
from jobs.local_server import find_free_port
from jobs.resolution import stored_file
from jobs.settings import REPO_ROOT, load_settings
from tests.conftest import (
    pipeline_file,
    produce,
    recent_clicks,
    run_jobs,
    wait_out_a_killed_lease,
)
from tests.expected import clicks_per_window, state_as_counter

pytestmark = pytest.mark.integration


@contextmanager
def warm_driver(  # type: ignore[no-untyped-def]
    settings, token: str, pipelines: Path, fault: str | None = None, train_events: int = 0
) -> Iterator[str]:
    """``python -m jobs serve`` on ``settings``; its log beside the pipelines."""
    port = find_free_port(15000, 16000)
    env = {k: v for k, v in os.environ.items() if k != "PLATFORM_FAULT"}
    env["PLATFORM_DRIVER_TOKEN"] = token
    env["PLATFORM_PIPELINES_DIR"] = str(pipelines)  # it runs only pipelines from there
    if fault:
        env["PLATFORM_FAULT"] = fault
    log = open(pipelines / f"driver-{port}.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobs", "serve", "--port", str(port)]
        + ["--bootstrap-servers", settings.bootstrap_servers]
        + ["--warehouse", str(settings.warehouse)]
        + ["--train-events", str(train_events)],
        cwd=REPO_ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60 + train_events / 100  # a slow day's training
        while True:
            try:
                with urllib.request.urlopen(url + "/v1/health", timeout=1):
                    break
            except OSError:
                assert proc.poll() is None, "the warm driver exited at start"
                assert time.monotonic() < deadline, "the warm driver did not come up"
                time.sleep(0.3)
        yield url
    finally:
        if fault:
            # The fault killed the driver's process group; the client can see its
            # socket close a moment before the process can be reaped.
            assert proc.wait(timeout=60) == -signal.SIGKILL
        elif proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # the driver, not its JVM: a clean stop
            assert proc.wait(timeout=60) == 0
        log.close()


def test_runs_on_a_warm_driver_are_exact(  # type: ignore[no-untyped-def]
    spark, settings, kafka_config, new_topic, tmp_path: Path, monkeypatch, s3_warehouse
) -> None:
    """On the bucket, as the compose stack runs it: the driver's token is in the
    user's own folder, and a killed driver's lease is taken over after it expires."""
    settings = replace(settings, warehouse=s3_warehouse)
    monkeypatch.setenv("PLATFORM_LEASE_SECONDS", "2")
    topic = new_topic(2)
    path = pipeline_file(tmp_path, "user_clicks", topic, archive=True)
    token = secrets.token_hex(16)
    first, second, third = recent_clicks(900, 0), recent_clicks(700, 3), recent_clicks(500, 5)
    app = settings.warehouse / "user_clicks"

    def state() -> object:
        rows = DeltaTable(str(app / "state")).to_pyarrow_table().to_pylist()
        return state_as_counter(rows, "clicks")

    trainings = set(Path(tempfile.gettempdir()).glob("platform-driver-training-*"))
    with warm_driver(settings, token, tmp_path, train_events=20_000) as url:
        # It trained on a broker and in a folder of its own, gone before it served.
        log = next(tmp_path.glob("driver-*.log")).read_text()
        assert "trained on 20,000 events in " in log, log[-3000:]
        assert set(Path(tempfile.gettempdir()).glob("platform-driver-training-*")) <= trainings
        remote = {"PLATFORM_DRIVER_URL": url, "PLATFORM_DRIVER_TOKEN": token}
        produce(kafka_config, topic, first)
        result = run_jobs(path, settings, "run", env=remote)
        assert result.returncode == 0, result.stderr[-2000:]
        assert "records in" in result.stdout  # the report, printed by the client
        assert state() == clicks_per_window([first])[0]

        # The pipeline changed under the same version: the driver refuses the run
        # before it records the definition (the client checks nothing itself).
        stored = stored_file(AppLayout(settings.warehouse, "user_clicks"), 1)
        recorded = stored.read_text()
        data = yaml.safe_load(path.read_text())
        data["window"]["size"] = "2 minutes"
        (tmp_path / "changed").mkdir()
        changed = tmp_path / "changed" / "user_clicks.yaml"
        changed.write_text(yaml.safe_dump(data))
        refused = run_jobs(changed, settings, "run", env=remote)
        assert refused.returncode == 2, refused.stderr[-2000:]
        assert refused.stderr.strip().splitlines()[-1].startswith("error: ")
        assert stored.read_text() == recorded
        assert state() == clicks_per_window([first])[0]

        # The stream DAG's operator sends its run there too (no spark-submit): the
        # second run in the same JVM carries the state on.
        from platform_airflow.operators import PlatformJobOperator

        for name, value in {
            **remote,
            "PLATFORM_WAREHOUSE": str(settings.warehouse),
            "PLATFORM_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        }.items():
            monkeypatch.setenv(name, value)
        produce(kafka_config, topic, second)
        operator = PlatformJobOperator(
            task_id="run",
            command="run",
            pipeline=str(path),
            arguments=["--trigger", "available-now", "--quiet"],
        )
        assert operator.warm_driver_url(load_settings()) == url
        assert operator.execute({"params": {}})["records_in"] == len(second)
        assert state() == clicks_per_window([first + second])[0]

        # Refusals: one error line, nothing run.
        wrong = run_jobs(path, settings, "run", env={**remote, "PLATFORM_DRIVER_TOKEN": "x"})
        assert wrong.returncode == 2
        last = wrong.stderr.strip().splitlines()[-1]
        assert last.startswith("error: the server at ") and "did not prove it holds" in last
        other = replace(settings, warehouse=tmp_path / "other")
        elsewhere = run_jobs(path, other, "run", env=remote)
        assert elsewhere.returncode == 2
        assert "the warm driver has other settings" in elsewhere.stderr.splitlines()[-1]

    # The driver dies after batch 0's changelog commit: the client says so, and a
    # run in its own process replays the batch exactly.
    produce(kafka_config, topic, third)
    with warm_driver(settings, token, tmp_path, fault="after_changelog") as url:
        remote = {"PLATFORM_DRIVER_URL": url, "PLATFORM_DRIVER_TOKEN": token}
        died = run_jobs(path, settings, "run", env=remote)
        assert died.returncode == 2
        assert "ended during the run" in died.stderr.strip().splitlines()[-1]
    wait_out_a_killed_lease(settings.warehouse)
    monkeypatch.delenv("PLATFORM_DRIVER_URL")
    # (a recovery need not be a new process: what it recovers from is on disk)
    local = run_jobs(path, settings, "run", spark=spark)
    assert local.returncode == 0, local.stderr[-2000:]
    assert state() == clicks_per_window([first + second + third])[0]
    raw = DeltaTable(str(app / "raw")).to_pyarrow_table()
    assert raw.num_rows == len(first + second + third)  # archived once each


def test_a_stop_during_the_training_ends_it_and_its_broker(settings, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """SIGTERM to the driver while it trains: the training's query, broker and folder
    end, then the driver, which never serves."""
    before = set(Path(tempfile.gettempdir()).glob("platform-driver-training-*"))
    port = find_free_port(15000, 16000)
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobs", "serve", "--port", str(port), "--train-events", "400000"]
        + ["--warehouse", str(settings.warehouse)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while not set(Path(tempfile.gettempdir()).glob("platform-driver-training-*")) - before:
            assert proc.poll() is None and time.monotonic() < deadline, "no training started"
            time.sleep(0.2)
        [folder] = set(Path(tempfile.gettempdir()).glob("platform-driver-training-*")) - before
        while not (folder / "warehouse").exists():  # its broker is up, its first run on
            assert proc.poll() is None and time.monotonic() < deadline, "no training run"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out[-3000:]
    assert "training stopped after " in out
    assert "listening" not in out
    assert not folder.exists()
    brokers = subprocess.run(["pgrep", "-f", str(folder)], capture_output=True, text=True)
    assert brokers.stdout == "", brokers.stdout
