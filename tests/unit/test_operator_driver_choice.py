"""Where the stream DAG's operator sends a run (``plugins/platform_airflow/operators.py``),
without Spark: available-now runs go to a warm driver first; when none takes one
(none answers, or it refuses before starting), the task logs why and uses
spark-submit, whose job then runs in its own process; a run that failed on the
driver fails the task (it is not run a second time)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from jobs.errors import ConfigError
from jobs.settings import load_settings
from jobs.warm_driver import DriverError, _handler, token_file
from platform_airflow.operators import PlatformJobOperator

TOKEN = "t" * 40


@pytest.fixture
def env(monkeypatch, tmp_path: Path) -> Path:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("PLATFORM_WAREHOUSE", str(tmp_path / "warehouse"))
    monkeypatch.delenv("PLATFORM_DRIVER_URL", raising=False)
    monkeypatch.delenv("PLATFORM_DRIVER_TOKEN", raising=False)
    monkeypatch.delenv("PLATFORM_FAULT", raising=False)
    return tmp_path / "warehouse"


def operator(trigger: str = "available-now", command: str = "run") -> PlatformJobOperator:
    return PlatformJobOperator(
        task_id="run",
        command=command,
        pipeline="user_clicks",
        arguments=["--trigger", trigger, "--quiet"],
    )


def test_the_driver_url_setting(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("PLATFORM_DRIVER_URL", raising=False)
    monkeypatch.setenv("PLATFORM_DRIVER_PORT", "18555")
    assert load_settings().scheduled_driver_url == "http://127.0.0.1:18555"
    assert load_settings().driver_url is None  # `run` by hand stays in its process
    monkeypatch.setenv("PLATFORM_DRIVER_URL", "http://127.0.0.1:18600")
    assert load_settings().scheduled_driver_url == "http://127.0.0.1:18600"
    monkeypatch.setenv("PLATFORM_DRIVER_URL", "off")
    assert load_settings().scheduled_driver_url is None
    assert load_settings().driver_url is None
    monkeypatch.setenv("PLATFORM_DRIVER_URL", "of")
    with pytest.raises(ConfigError, match="loopback"):
        load_settings()


def test_which_tasks_look_for_a_warm_driver(env: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    settings = load_settings()
    assert operator().warm_driver_url(settings) == settings.scheduled_driver_url
    assert operator("continuous").warm_driver_url(settings) is None
    assert operator(command="verify").warm_driver_url(settings) is None
    monkeypatch.setenv("PLATFORM_DRIVER_URL", "off")
    assert operator().warm_driver_url(load_settings()) is None


@pytest.fixture
def submitted(monkeypatch) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    """The environment each spark-submit would have been given (none is started)."""
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    calls: list[dict[str, Any]] = []

    def execute(self: Any, context: Any) -> str:
        calls.append(dict(self.env_vars))
        return "spark-submit"

    monkeypatch.setattr(SparkSubmitOperator, "execute", execute)
    return calls


def test_no_driver_running_falls_back_to_spark_submit(env, submitted, capfd) -> None:  # type: ignore[no-untyped-def]
    assert operator().execute({"params": {}}) == "spark-submit"
    # The task log says why (Airflow's logger writes to the task's output).
    [message] = [line for line in capfd.readouterr().out.splitlines() if "instead" in line]
    assert "not on a warm driver, with spark-submit instead" in message
    assert "token" in message  # no driver of this warehouse wrote one
    # The job that spark-submit starts runs in its own process, not on a driver.
    assert submitted[0]["PLATFORM_DRIVER_URL"] == ""


@pytest.fixture
def fake_driver(env: Path) -> Iterator[dict[str, Any]]:
    """A warm driver's HTTP side, without Spark; ``behaviour`` decides its answers."""
    behaviour: dict[str, Any] = {"check": None, "run": None, "runs": 0}

    class Driver:
        code = "c0de"
        slots = threading.BoundedSemaphore(1)

        def check(self, request: Any) -> str:
            if behaviour["check"] is not None:
                raise behaviour["check"]
            return str(request.pipeline)

        def run(self, pipeline: str) -> dict[str, Any]:
            behaviour["runs"] += 1
            if behaviour["run"] is not None:
                raise behaviour["run"]
            return {"application_id": "user_clicks", "epoch": 0, "seconds": 1.0, "batches": []}

    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(Driver(), TOKEN))  # type: ignore[arg-type]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    path = token_file(load_settings(), port)
    path.parent.mkdir(parents=True)
    path.write_text(TOKEN)
    behaviour["url"] = f"http://127.0.0.1:{port}"
    try:
        yield behaviour
    finally:
        server.shutdown()
        server.server_close()


def test_a_run_the_driver_takes_never_reaches_spark_submit(  # type: ignore[no-untyped-def]
    fake_driver, submitted, monkeypatch
) -> None:
    monkeypatch.setenv("PLATFORM_DRIVER_URL", fake_driver["url"])
    assert operator().execute({"params": {}}) == {"batches": 0, "records_in": 0}
    assert fake_driver["runs"] == 1 and submitted == []


def test_a_refusal_before_the_run_falls_back(fake_driver, submitted, monkeypatch, capfd) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("PLATFORM_DRIVER_URL", fake_driver["url"])
    fake_driver["check"] = ConfigError("the warm driver runs other code: restart it")
    assert operator().execute({"params": {}}) == "spark-submit"
    assert fake_driver["runs"] == 0 and len(submitted) == 1
    assert "refused the run: the warm driver runs other code" in capfd.readouterr().out


def test_a_run_that_failed_on_the_driver_fails_the_task(  # type: ignore[no-untyped-def]
    fake_driver, submitted, monkeypatch
) -> None:
    monkeypatch.setenv("PLATFORM_DRIVER_URL", fake_driver["url"])
    fake_driver["run"] = RuntimeError("boom in a batch")
    with pytest.raises(DriverError) as failed:
        operator().execute({"params": {}})
    assert failed.value.exit_code == 1 and "boom in a batch" in str(failed.value)
    assert fake_driver["runs"] == 1 and submitted == []  # not run a second time


def test_a_fault_to_inject_sends_the_run_to_spark_submit(env, submitted, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("PLATFORM_FAULT", "after_changelog")
    assert operator().execute({"params": {}}) == "spark-submit"
    assert submitted[0]["PLATFORM_FAULT"] == "after_changelog"


@pytest.mark.parametrize("url", ["http://127.0.0.1:99999", "http://127.0.0.1:port"])
def test_a_malformed_driver_url_fails_the_task_with_one_line(  # type: ignore[no-untyped-def]
    env, submitted, monkeypatch, url: str
) -> None:
    """A setting that cannot be right is a configuration error, not a reason to
    fall back (the port out of range was a ValueError traceback)."""
    task = operator()  # parsed before the worker's environment changed
    monkeypatch.setenv("PLATFORM_DRIVER_URL", url)
    with pytest.raises(ConfigError, match="PLATFORM_DRIVER_URL must be") as refused:
        task.execute({"params": {}})
    assert "\n" not in str(refused.value) and submitted == []
