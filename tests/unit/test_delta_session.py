"""A host session (``hosted_by``) without Delta's extension, without the
platform's jars, or (on S3) without the settings that make the store refuse a
stale holder's writes, is refused up front."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from jobs.errors import ConfigError
from jobs.settings import load_settings
from jobs.streaming import spark as sessions
from jobs.warehouse import Location


class FakeConf:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)


class FakeSession:
    def __init__(self, values: dict[str, str], missing: str = "") -> None:
        self.conf = FakeConf(values)

        def class_for_name(name: str, _init: bool, _loader: bool) -> str:
            if name == missing:
                raise RuntimeError(f"java.lang.ClassNotFoundException: {name}")
            return name

        utils = SimpleNamespace(Utils=SimpleNamespace(classForName=class_for_name))
        jvm = SimpleNamespace(
            org=SimpleNamespace(apache=SimpleNamespace(spark=SimpleNamespace(util=utils)))
        )
        self.sparkContext = SimpleNamespace(_jvm=jvm)


def test_a_session_without_deltas_extension_is_refused() -> None:
    bare: Any = FakeSession({})
    with pytest.raises(ConfigError, match=r"spark\.sql\.extensions"), sessions.hosted_by(bare):
        pass
    assert sessions._host is None


def test_a_session_with_another_extension_besides_delta_is_hosted() -> None:
    conf = {k: v for k, v in sessions.DELTA_CONF.items() if k.startswith("spark.sql.")}
    conf["spark.sql.extensions"] = "com.example.Other," + sessions.DELTA_EXTENSION
    host: Any = FakeSession(conf)
    with sessions.hosted_by(host):
        assert sessions._host is host
    assert sessions._host is None


def test_a_session_without_the_platforms_jars_is_refused() -> None:
    conf = {k: v for k, v in sessions.DELTA_CONF.items() if k.startswith("spark.sql.")}
    host: Any = FakeSession(conf, missing=sessions.CLOCK_SOURCE)
    with (
        pytest.raises(ConfigError, match=r"own JVM source is not on the driver's classpath"),
        sessions.hosted_by(host),
    ):
        pass
    assert sessions._host is None


S3_REFUSALS = {**sessions.LOG_STORES, **sessions.CHECKPOINT_FILES}


def test_a_host_session_on_s3_must_have_the_stores_refusals() -> None:
    """The platform's own sessions create Delta log entries and Spark's checkpoint
    files put-if-absent on S3, so the store refuses a stale holder's write; a host's
    session without those settings would not: refused, naming each setting."""
    warehouse = Location.parse("s3://bucket/warehouse")
    sessions.check_store_settings(S3_REFUSALS, warehouse)
    with pytest.raises(ConfigError) as refused:
        sessions.check_store_settings({}, warehouse)
    message = str(refused.value)
    assert "\n" not in message and message.startswith("this Spark session lacks ")
    for key, value in S3_REFUSALS.items():
        assert f"{key}={value}" in message
    other = {
        **S3_REFUSALS,
        "spark.delta.logStore.s3a.impl": "io.delta.storage.S3SingleDriverLogStore",
    }
    with pytest.raises(ConfigError, match=r"lacks spark\.delta\.logStore\.s3a\.impl=platform\."):
        sessions.check_store_settings(other, warehouse)


def test_a_host_session_on_a_local_disk_needs_none_of_them(tmp_path: Path) -> None:
    sessions.check_store_settings({}, Location.local_path(tmp_path))


def test_a_command_in_a_host_session_without_them_is_refused_before_it_starts() -> None:
    conf = {k: v for k, v in sessions.DELTA_CONF.items() if k.startswith("spark.sql.")}
    host: Any = FakeSession(conf)
    on_s3 = replace(load_settings(), warehouse=Location.parse("s3://bucket/warehouse"))
    with sessions.hosted_by(host):
        with (
            pytest.raises(ConfigError, match=r"spark\.delta\.logStore\.s3a\.impl"),
            sessions.command_session(on_s3, "test"),
        ):
            raise AssertionError("the command ran")
        host.conf.values.update(S3_REFUSALS)
        with sessions.command_session(on_s3, "test") as spark:
            assert spark is host
