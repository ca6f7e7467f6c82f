"""A host session (``hosted_by``) without Delta's extension is refused up front."""

from __future__ import annotations

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
    def __init__(self, values: dict[str, str]) -> None:
        self.conf = FakeConf(values)


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
