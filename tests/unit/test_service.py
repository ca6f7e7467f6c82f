"""The warm driver's request checks (``jobs/service.py``), without Spark: what a
client sends is validated, and a client with other settings is told apart."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from jobs.errors import ConfigError
from jobs.service import FIELDS, RunRequest, settings_digest
from jobs.settings import load_settings

GOOD = {name: "x" for name in FIELDS}


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"\xff\xfe",
        json.dumps([GOOD]).encode(),
        json.dumps({**GOOD, "extra": "x"}).encode(),
        json.dumps({k: v for k, v in GOOD.items() if k != "code"}).encode(),
        json.dumps({**GOOD, "pipeline": 3}).encode(),
        json.dumps({**GOOD, "pipeline": ""}).encode(),
        json.dumps({**GOOD, "settings": "s" * 5000}).encode(),
    ],
)
def test_bad_requests_are_refused(body: bytes) -> None:
    with pytest.raises(ConfigError):
        RunRequest.parse(body)


def test_a_good_request_parses() -> None:
    assert RunRequest.parse(json.dumps(GOOD).encode()) == RunRequest("x", "x", "x", "x")


def test_settings_that_change_where_data_goes_change_the_digest(tmp_path) -> None:  # type: ignore[no-untyped-def]
    base = load_settings()
    assert settings_digest(base) == settings_digest(replace(base))
    for other in (
        replace(base, warehouse=tmp_path),
        replace(base, bootstrap_servers="127.0.0.1:1"),
        replace(base, kafka_client={"security.protocol": "SASL_SSL"}),
    ):
        assert settings_digest(other) != settings_digest(base)


@pytest.mark.parametrize("url", ["http://10.0.0.1:18090", "https://127.0.0.1:1", "127.0.0.1:1"])
def test_the_driver_url_must_be_loopback(monkeypatch, url: str) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("PLATFORM_DRIVER_URL", url)
    with pytest.raises(ConfigError, match="loopback"):
        load_settings()
