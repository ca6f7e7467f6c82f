"""Commands run in a process that has a Spark session already (``hosted_by``)."""

from __future__ import annotations

import pytest

from tests.conftest import jobs_args, pipeline_file, produce, recent_clicks, run_in_process

pytestmark = pytest.mark.integration


def test_a_command_outside_hosted_by_is_refused_and_leaves_the_session_running(  # type: ignore[no-untyped-def]
    spark, settings, kafka_config, new_topic, tmp_path
) -> None:
    from contextlib import redirect_stderr, redirect_stdout
    from io import StringIO

    from jobs.cli import main

    topic = new_topic(1)
    produce(kafka_config, topic, recent_clicks(20, 0))
    pipeline = pipeline_file(tmp_path, "user_clicks", topic)
    argv = jobs_args(pipeline, settings.bootstrap_servers, settings.warehouse, "run", "--quiet")

    err = StringIO()
    with redirect_stdout(StringIO()), redirect_stderr(err):
        code = main(argv)  # not hosted: it would have stopped this process's session
    errors = [line for line in err.getvalue().splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "hosted_by" in errors[0], err.getvalue()
    assert spark.range(3).count() == 3  # still running
    assert not (settings.warehouse / "user_clicks" / "_ledger").exists()

    hosted = run_in_process(spark, argv)
    assert hosted.returncode == 0, hosted.stderr[-3000:]
    assert spark.range(3).count() == 3
