"""A host session (``hosted_by``) without Delta's extension, or without the
platform's jars, is refused up front."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from jobs.errors import ConfigError
from jobs.streaming import spark as sessions


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
