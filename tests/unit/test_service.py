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


def test_a_driver_started_without_a_token_makes_one_only_its_user_can_read(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import stat

    from jobs.service import client_token, driver_token

    settings = replace(load_settings(), warehouse=tmp_path)
    token, path = driver_token(settings, 18090, given=None)
    assert path is not None and len(token) >= 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert path.read_text() == token
    # A client of the same user (and warehouse) finds it; an explicit one wins.
    assert client_token(settings, "http://127.0.0.1:18090", given=None) == token
    assert client_token(settings, "http://127.0.0.1:18090", given="mine") == "mine"
    with pytest.raises(ConfigError, match="PLATFORM_DRIVER_TOKEN"):
        client_token(settings, "http://127.0.0.1:18091", given=None)
    # A token given to the driver is used as it is, and written nowhere.
    assert driver_token(settings, 18092, given="secret") == ("secret", None)


def test_the_driver_runs_only_pipelines_of_its_folder(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from jobs.service import RunRequest, WarmDriver, file_sha256
    from jobs.streaming.spark import package_digest

    folder = tmp_path / "pipelines"
    folder.mkdir()
    settings = replace(load_settings(), warehouse=tmp_path / "w", pipelines_dir=folder)
    driver = WarmDriver(None, settings)  # type: ignore[arg-type]
    outside = tmp_path / "user_clicks.yaml"
    outside.write_text((load_settings().pipelines_dir / "user_clicks.yaml").read_text())
    for path in (outside, folder / ".." / "user_clicks.yaml"):
        digest = file_sha256(outside)
        request = RunRequest(str(path), digest, package_digest(), driver.settings_digest)
        with pytest.raises(ConfigError, match="only pipelines under"):
            driver.check(request)
    inside = folder / "user_clicks.yaml"
    inside.write_text(outside.read_text())
    request = RunRequest(str(inside), file_sha256(inside), package_digest(), driver.settings_digest)
    assert driver.check(request).application_id == "user_clicks"
