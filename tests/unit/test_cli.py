"""The command line: bad input exits 2 with one clear line and no traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from jobs.settings import REPO_ROOT


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jobs", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run"], "the following arguments are required: --pipeline"),
        (["run", "--pipeline", "nope"], "no pipeline file"),
        (["run", "--pipeline", "user_clicks", "--trigger", "sometimes"], "invalid choice"),
        (["run", "--pipeline", "user_clicks", "--bootstrap-servers", "x y"], "HOST:PORT"),
        (["status", "--pipeline", "../x"], "not a valid application id"),
        (["frobnicate"], "invalid choice"),
        (["broker", "start", "--port", "99999"], "--port must be 1-65535"),
        # 0 is no port (it was taken as "not given", and the default served instead)
        (["broker", "status", "--port", "0"], "--port must be 1-65535, got 0"),
        (["storage", "status", "--port", "0"], "--port must be 1-65535, got 0"),
        (["serve", "--port", "0"], "--port must be 1-65535, got 0"),
        (["metrics", "--serve", "--port", "70000"], "--port must be 1-65535, got 70000"),
        (["serve", "--train-events", "-1"], "--train-events must be 0-50,000,000, got -1"),
        (["serve", "--train-events", "lots"], "invalid int value: 'lots'"),
        (
            ["rewind", "--pipeline", "user_clicks", "--reason", "r", "--plan", "p1", "--dry-run"],
            "--plan applies a saved plan: leave out --dry-run",
        ),
    ],
)
def test_bad_arguments(args: list[str], message: str) -> None:
    result = run_cli(*args)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_bad_environment_value() -> None:
    import os

    env = {**os.environ, "PLATFORM_BROKER_PORT": "http"}
    result = run_cli("status", "--pipeline", "user_clicks", env=env)
    assert result.returncode == 2
    assert "PLATFORM_BROKER_PORT must be a port number" in result.stderr


def test_an_unexpected_failure_ends_with_one_error_line() -> None:
    from jobs.errors import crash_summary

    spark = RuntimeError(
        "An error occurred while calling o52.awaitTermination.\n"
        "[ARITHMETIC_OVERFLOW] long overflow. Use 'try_multiply' to tolerate overflow. "
        "SQLSTATE: 22003\n== SQL (line 1, position 1) ==\n at org.apache.spark..."
    )
    line = crash_summary(spark)
    assert line.startswith("Spark failed with [ARITHMETIC_OVERFLOW] long overflow.")
    assert "\n" not in line and "nothing of the unfinished batch" in line
    plain = crash_summary(KeyError("window_start"))
    assert plain.startswith("KeyError: 'window_start';") and "\n" not in plain


# A batch function's failure as Spark 4.2 reports it: the cause is the last line
# of the Python traceback inside the message (shortened; the real one goes on with
# the query's plans).
FOREACH_BATCH_FAILURE = (
    "[STREAM_FAILED] Query [id = 715f, runId = b5e9] terminated with exception: "
    "[FOREACH_BATCH_USER_FUNCTION_ERROR] An error occurred in the user provided function in "
    "foreach batch sink. Reason: An exception was raised by the Python Proxy. Return Message: "
    "Traceback (most recent call last):\n"
    '  File "/venv/py4j/clientserver.py", line 644, in _call_proxy\n'
    "    return_value = getattr(self.pool[obj_id], method)(*params)\n"
    "                   ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
    '  File "/venv/pyspark/sql/utils.py", line 163, in call\n'
    "    self.func(DataFrame(jdf, wrapped_session_jdf), batch_id)\n"
    "{cause}\n"
    " SQLSTATE: 39000 SQLSTATE: XXKST\n"
    "=== Streaming Query ===\n"
    "Identifier: [id = 715f, runId = b5e9]\n"
    "Logical Plan:\n"
    "~WriteToMicroBatchDataSourceV1 ForeachBatchSink, 715f, Append\n"
)


@pytest.mark.parametrize(
    ("cause", "expected"),
    [
        ("ValueError: boom: the real cause", "ValueError: boom: the real cause;"),
        (
            "pyspark.errors.exceptions.captured.SparkRuntimeException: [USER_RAISED_EXCEPTION] "
            "kafka gone SQLSTATE: P0001",
            "Spark failed with [USER_RAISED_EXCEPTION] kafka gone;",
        ),
        (
            'pyspark.errors.exceptions.captured.NumberFormatException: For input string: "x"',
            'NumberFormatException: For input string: "x";',
        ),
        (
            "py4j.protocol.Py4JJavaError: An error occurred while calling o81.count.\n"
            ": org.apache.kafka.common.errors.TimeoutException: Timeout of 60000ms expired",
            "TimeoutException: Timeout of 60000ms expired;",
        ),
    ],
)
def test_a_failed_batch_function_is_reported_by_its_cause(cause: str, expected: str) -> None:
    from jobs.errors import crash_summary

    line = crash_summary(RuntimeError(FOREACH_BATCH_FAILURE.format(cause=cause)))
    assert line.startswith(expected), line
    assert "\n" not in line and "nothing of the unfinished batch" in line


def test_a_jvm_source_error_is_an_expected_failure_by_its_message() -> None:
    """Spark's message keeps only the innermost message of a failed batch's planning;
    the class that says it is the platform's is in the Java trace pyspark keeps."""
    from jobs.errors import EXIT_ERROR, failure

    class Captured(Exception):  # as pyspark's StreamingQueryException keeps it
        _stackTrace = (
            "org.apache.spark.sql.streaming.StreamingQueryException: dimension table t\n"
            "\tat org.apache.spark.sql.execution.streaming.StreamExecution.run\n"
            "Caused by: platform.streaming.PlatformError: dimension table t version 3 is "
            "over 70 MiB as JSON rows\n\tat platform.streaming.PinnedDeltaSource.readRows\n"
        )

    exc = Captured("[STREAM_FAILED] Query terminated with exception: dimension table t")
    assert failure(exc) == (EXIT_ERROR, "dimension table t version 3 is over 70 MiB as JSON rows")
    assert failure(Exception("dimension table t"))[0] != EXIT_ERROR


def test_a_crash_prints_the_traceback_then_one_error_line(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    from jobs import cli, status

    def broken(*_args: object, **_kwargs: object) -> None:
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(status, "application_status", broken)
    assert cli.main(["status", "--pipeline", "user_clicks"]) == cli.EXIT_CRASH
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback (most recent call last):" in err
    assert err[-1].startswith("error: ZeroDivisionError: division by zero;")


@pytest.mark.parametrize("command", ["run", "status", "rewind", "dimension", "serve", "metrics"])
def test_the_warehouse_argument_keeps_an_s3_uri_whole(command: str) -> None:
    """``--warehouse s3://bucket/prefix`` is the bucket's prefix, never a local
    folder named ``s3:`` (a ``Path`` collapses ``//``)."""
    from jobs.cli import _settings, build_parser

    extra = {"rewind": ["--to-earliest", "--reason", "r"], "dimension": ["--dimension", "d"]}.get(
        command, []
    )
    pipeline = [] if command in ("dimension", "serve", "metrics") else ["--pipeline", "p"]
    args = build_parser().parse_args(
        [command, *pipeline, *extra, "--warehouse", "s3://bucket/team/prefix"]
    )
    assert _settings(args).warehouse.uri == "s3://bucket/team/prefix"


@pytest.mark.parametrize("raw", ["s3:/bucket/prefix", "s3a:/bucket", "s3:bucket"])
def test_a_uri_that_lost_a_slash_is_refused(raw: str) -> None:
    from jobs.errors import ConfigError
    from jobs.warehouse import Location

    with pytest.raises(ConfigError, match="s3://bucket/prefix"):
        Location.parse(raw)


@pytest.mark.parametrize(
    "message",
    ["Generic S3 error", "Generic S3 error: Error after 10 retries in 3s: error sending request"],
)
def test_a_store_delta_rs_cannot_reach_is_one_error_line(message: str) -> None:
    """delta-rs' own reads (a status, a table load) fail with a bare OSError when the
    store does not answer: an expected failure with its repair, not a crash."""
    from jobs.errors import failure

    code, line = failure(OSError(message))
    assert code == 2
    assert line.startswith("the object store did not answer or refused a request (Generic S3")
    assert "AWS_ENDPOINT_URL" in line and "traceback" not in line


@pytest.mark.parametrize(
    ("trigger", "lifetime"), [([], "short"), (["--trigger", "continuous"], "long")]
)
def test_a_run_tells_its_session_how_long_it_lives(  # type: ignore[no-untyped-def]
    trigger: list[str], lifetime: str, monkeypatch, tmp_path
) -> None:
    """A scheduled (available-now) run is a short process: its JVM gets the JIT's
    directives for one (``jvm.jit_options``); a continuous run does not."""
    from contextlib import contextmanager

    from jobs import cli, lock
    from jobs.streaming import run, spark

    asked: list[str] = []

    @contextmanager
    def session(*_args: object, lifetime: str, **_kwargs: object):  # type: ignore[no-untyped-def]
        asked.append(lifetime)
        raise ZeroDivisionError("stop here")
        yield

    monkeypatch.setattr(run, "preflight", lambda *_args: None)
    monkeypatch.setattr(lock, "holder", lambda *_args: None)
    monkeypatch.setattr(spark, "command_session", session)
    argv = ["run", "--pipeline", "user_clicks", "--warehouse", str(tmp_path), *trigger]
    assert cli.main(argv) == cli.EXIT_CRASH
    assert asked == [lifetime]


@pytest.mark.parametrize("bucket", ["abc_def", "abc/../x", "abc-", "warehouse\n"])
def test_a_bucket_name_s3_refuses_is_refused_before_the_server_starts(  # type: ignore[no-untyped-def]
    bucket: str, monkeypatch, capsys
) -> None:
    from jobs import cli, storage_server

    def start(*_args: object) -> None:
        raise AssertionError("the server started")

    monkeypatch.setattr(storage_server, "start", start)
    assert cli.main(["storage", "start", "--bucket", bucket]) == 2
    assert "is not an S3 bucket name" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["broker", "start", "--nodes", "3", "--port", "19500"], "--port starts one node"),
        (["metrics", "--port", "9500"], "--port is where --serve listens"),
        (["storage", "check", "--port", "19500"], "--port starts the S3 server"),
    ],
)
def test_a_port_that_would_be_ignored_is_refused(  # type: ignore[no-untyped-def]
    argv: list[str], message: str, monkeypatch, capsys
) -> None:
    from jobs import broker, cli, metrics_exporter

    def work(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the command ran without its --port")

    monkeypatch.setattr(broker, "start_cluster", work)
    monkeypatch.setattr(broker, "cluster_status", lambda *_args: {})
    monkeypatch.setattr(metrics_exporter, "exposition", work)
    monkeypatch.setattr(cli, "_storage_check", work)
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


def test_a_port_for_a_data_dir_that_holds_a_cluster_is_refused(  # type: ignore[no-untyped-def]
    monkeypatch, capsys
) -> None:
    from jobs import broker, cli

    def work(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the cluster started without its --port")

    monkeypatch.setattr(broker, "start_cluster", work)
    monkeypatch.setattr(broker, "cluster_status", lambda *_args: {1: None, 2: None, 3: None})
    assert cli.main(["broker", "start", "--port", "19500"]) == 2
    assert "--port starts one node" in capsys.readouterr().err
