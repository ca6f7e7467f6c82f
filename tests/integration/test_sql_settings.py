"""The Spark SQL settings that change results are the platform's, not the host's:
a ``spark-defaults.conf`` cannot change what a batch computes, and a session that
would compute otherwise is refused with one line naming the setting."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.errors import ConfigError
from jobs.settings import REPO_ROOT

pytestmark = pytest.mark.integration

PROBE = """
from jobs.streaming.spark import get_spark
spark = get_spark("local[1]", "settings-probe")
print(spark.conf.get("spark.sql.ansi.enabled"), spark.conf.get("spark.sql.session.timeZone"))
try:
    print(spark.sql("SELECT CAST(2147483647 AS INT) + 1").collect()[0][0])
except Exception as exc:
    print("ARITHMETIC_OVERFLOW" in str(exc) and "overflow")
"""


def test_a_hosts_spark_defaults_do_not_change_the_computation(tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text(
        "spark.sql.ansi.enabled false\nspark.sql.session.timeZone America/New_York\n"
    )
    env = {**os.environ, "SPARK_CONF_DIR": str(conf), "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["true", "UTC", "overflow"], done.stdout


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("spark.sql.ansi.enabled", "false", "has spark.sql.ansi.enabled=false"),
        ("spark.sql.legacy.timeParserPolicy", "LEGACY", "spark.sql.legacy.timeParserPolicy"),
        ("spark.sql.session.timeZone", "Europe/Paris", "has spark.sql.session.timeZone"),
        (
            "spark.sql.legacy.setopsPrecedence.enabled",
            "true",
            "sets spark.sql.legacy.setopsPrecedence.enabled=true",
        ),
    ],
)
def test_a_session_that_would_compute_otherwise_is_refused(  # type: ignore[no-untyped-def]
    spark, key: str, value: str, message: str
) -> None:
    from jobs.pipeline.parser import load_pipeline
    from jobs.streaming import analyser

    pipeline = load_pipeline("user_clicks", REPO_ROOT / "include" / "pipelines")
    before = spark.conf.get(key, None)
    spark.conf.set(key, value)
    try:
        with pytest.raises(ConfigError) as error:
            analyser.resolve(spark, pipeline)
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)
    assert message in str(error.value) and "\n" not in str(error.value)
    assert analyser.resolve(spark, pipeline).sql_settings["spark.sql.ansi.enabled"] == "true"


def test_a_legacy_setting_at_spark_s_default_is_no_change(spark) -> None:  # type: ignore[no-untyped-def]
    from jobs.pipeline.parser import load_pipeline
    from jobs.streaming import analyser

    pipeline = load_pipeline("user_clicks", REPO_ROOT / "include" / "pipelines")
    spark.conf.set("spark.sql.legacy.setopsPrecedence.enabled", "false")
    try:
        assert analyser.resolve(spark, pipeline).sql_settings["spark.sql.session.timeZone"] == "UTC"
    finally:
        spark.conf.unset("spark.sql.legacy.setopsPrecedence.enabled")
