"""The embedded broker's configuration and the jar folders it and Spark use."""

from __future__ import annotations

import re
from pathlib import Path

import pyspark
import pytest

from jobs import broker, jars
from jobs.errors import ConfigError


def _properties(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line)


def test_the_broker_listens_on_loopback_only_and_creates_no_topic_by_itself(
    tmp_path: Path,
) -> None:
    settings = _properties(broker.server_properties(tmp_path, 29092, 29093))
    assert settings["process.roles"] == "broker,controller"
    listeners = settings["listeners"].split(",")
    assert listeners == ["PLAINTEXT://127.0.0.1:29092", "CONTROLLER://127.0.0.1:29093"]
    assert settings["advertised.listeners"] == "PLAINTEXT://127.0.0.1:29092"
    assert settings["controller.quorum.voters"] == "1@127.0.0.1:29093"
    assert settings["auto.create.topics.enable"] == "false"
    assert settings["log.dirs"] == str(tmp_path / broker.LOG_DIR)
    factors = [value for key, value in settings.items() if key.endswith("replication.factor")]
    assert len(factors) >= 4 and set(factors) == {"1"}


def test_missing_jars_name_the_command_that_resolves_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(jars.ENV, str(tmp_path))
    with pytest.raises(ConfigError, match=r"no jars in .*spark: run make setup"):
        jars.spark_jars()
    (tmp_path / "kafka").mkdir()
    (tmp_path / "kafka" / "kafka_2.13-4.3.1.jar").write_bytes(b"")
    assert jars.broker_classpath() == [tmp_path / "kafka" / "kafka_2.13-4.3.1.jar"]
    # Resolved but not built (a checkout that predates include/jvm/sources).
    (tmp_path / "spark").mkdir()
    (tmp_path / "spark" / "spark-sql-kafka-0-10_2.13-4.2.0.jar").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"no platform-sources.jar in .*: run make setup"):
        jars.spark_jars()


def test_the_resolved_jars_hold_sparks_kafka_source_and_no_second_spark() -> None:
    names = [jar.name for jar in jars.spark_jars()]
    assert any(name.startswith("spark-sql-kafka-0-10_2.13-4.2.0") for name in names)
    assert jars.SOURCES_JAR in names
    assert "hadoop-aws-3.5.0.jar" in names  # S3A, at pyspark's Hadoop version
    # pyspark/jars has Spark, Scala, Hadoop, netty, ...: a second copy of an artifact
    # (at another version) would shadow or break it.
    pyspark_jars = Path(pyspark.__file__).parent / "jars"
    artifact = re.compile(r"^(.+?)-\d[\w.]*(?:-[A-Za-z][\w.]*)*\.jar$")

    def artifacts(found: list[str]) -> set[str]:
        return {m[1] for m in map(artifact.match, found) if m}

    own = artifacts([jar.name for jar in pyspark_jars.glob("*.jar")])
    assert "hadoop-client-api" in own and "netty-common" in own
    assert not artifacts(names) & own


def test_free_ports_come_from_a_narrow_range_wherever_the_pid_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Before: the search began at start + pid % 1000, past the end of a narrow range.
    monkeypatch.setattr(broker.os, "getpid", lambda: 999)
    port = broker.find_free_port(12000, 12010, run=3)
    assert 12000 <= port <= 12007
    assert all(broker.port_is_free(p) for p in range(port, port + 3))
