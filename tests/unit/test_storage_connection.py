"""The warehouse's object store from an Airflow ``aws`` connection
(``PLATFORM_AWS_CONN_ID``): the standard AWS variables the jobs Airflow starts and
its own reads of the warehouse get (``plugins/platform_airflow/hooks.py``)."""

from __future__ import annotations

import json
import os

import pytest

from jobs.errors import ConfigError
from jobs.settings import load_settings
from platform_airflow.hooks import ObjectStorageHook, storage_environment, use_storage_connection


def connection(monkeypatch: pytest.MonkeyPatch, conn_id: str, **fields: object) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(fields))


def test_an_aws_connection_becomes_the_aws_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    connection(
        monkeypatch,
        "warehouse_s3",
        conn_type="aws",
        login="AKID",
        password="s3cr3t/+=",
        extra={"endpoint_url": "http://127.0.0.1:9000", "region_name": "eu-west-1"},
    )
    assert ObjectStorageHook("warehouse_s3").environment() == {
        "AWS_ACCESS_KEY_ID": "AKID",
        "AWS_SECRET_ACCESS_KEY": "s3cr3t/+=",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        "AWS_REGION": "eu-west-1",
        "AWS_ALLOW_HTTP": "true",
    }


def test_the_providers_other_places_for_the_endpoint_and_keys(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    connection(
        monkeypatch,
        "other_form",
        conn_type="aws",
        extra={
            "aws_access_key_id": "AKID",
            "aws_secret_access_key": "secret",
            "aws_session_token": "token",
            "service_config": {"s3": {"endpoint_url": "https://s3.example.com"}},
        },
    )
    found = ObjectStorageHook("other_form").environment()
    assert found == {
        "AWS_ACCESS_KEY_ID": "AKID",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "AWS_SESSION_TOKEN": "token",
        "AWS_ENDPOINT_URL": "https://s3.example.com",
    }
    # No keys at all: the worker's instance profile (S3A's and obstore's own chains).
    connection(monkeypatch, "profile", conn_type="aws")
    assert ObjectStorageHook("profile").environment() == {}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"conn_type": "spark", "host": "spark://x"}, "not 'aws'"),
        ({"conn_type": "aws", "extra": {"endpoint_url": "ftp://x"}}, "endpoint_url must be"),
    ],
)
def test_a_wrong_connection_is_one_clear_error(
    monkeypatch: pytest.MonkeyPatch, fields: dict[str, object], message: str
) -> None:
    connection(monkeypatch, "bad", **fields)
    with pytest.raises(ConfigError, match=message) as refused:
        ObjectStorageHook("bad").environment()
    assert "\n" not in str(refused.value)


def test_the_setting_chooses_the_connection_and_the_task_uses_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PLATFORM_AWS_CONN_ID", raising=False)
    assert load_settings().aws_conn_id is None
    assert storage_environment(load_settings()) == {}  # the worker's own variables
    connection(monkeypatch, "store", conn_type="aws", login="id", password="pw")
    monkeypatch.setenv("PLATFORM_AWS_CONN_ID", "store")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "the worker's")  # (restored after the test)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "the worker's")
    use_storage_connection(load_settings())
    assert os.environ["AWS_ACCESS_KEY_ID"] == "id" and os.environ["AWS_SECRET_ACCESS_KEY"] == "pw"
    monkeypatch.setenv("PLATFORM_AWS_CONN_ID", "no such id!")
    with pytest.raises(ConfigError, match="PLATFORM_AWS_CONN_ID must be an Airflow connection"):
        load_settings()
