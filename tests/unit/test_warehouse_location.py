"""What a warehouse may be called, and how its locations compose."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.errors import ConfigError
from jobs.warehouse import Location, StorageError, s3a_settings


@pytest.mark.parametrize(
    ("given", "uri"),
    [
        ("s3://warehouse", "s3://warehouse"),
        ("s3://warehouse/", "s3://warehouse"),
        ("s3://my.bucket-1/a/b/", "s3://my.bucket-1/a/b"),
        ("s3a://warehouse/x", "s3://warehouse/x"),
        ("s3://warehouse//a", "s3://warehouse/a"),
    ],
)
def test_s3_warehouses_are_normalised(given: str, uri: str) -> None:
    assert Location.parse(given).uri == uri


@pytest.mark.parametrize(
    "given",
    [
        "s3://",
        "s3://ab",
        "s3://Upper/x",
        "s3://warehouse/../x",
        "s3://warehouse/./x",
        "gs://bucket/x",
        "abfss://c@a/x",
        "hdfs://nn/x",
        "",
        "s3://bad_bucket/x",
        "s3://warehouse/a\x00b",
        "s3://warehouse/a%2E%2E/x",  # '..' to the stores' URL parsers
        "s3://warehouse/a#b",
        "s3://warehouse/a?b",
    ],
)
def test_anything_else_is_refused_with_what_is_accepted(given: str) -> None:
    with pytest.raises(ConfigError, match=r"s3://bucket/prefix"):
        Location.parse(given)


def test_local_paths_are_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert Location.parse("wh").uri == str(tmp_path / "wh")
    assert Location.parse(f"file://{tmp_path}/wh").uri == str(tmp_path / "wh")


def test_names_compose_and_never_climb() -> None:
    root = Location.parse("s3://warehouse/prefix")
    table = root / "app" / "state"
    assert table.uri == "s3://warehouse/prefix/app/state"
    assert table.name == "state" and table.parent.parent == root
    assert root.parent == Location("s3://warehouse")
    assert table.spark_uri == "s3a://warehouse/prefix/app/state"
    assert table.bucket == "warehouse" and table.key == "prefix/app/state"
    assert Location.parse("s3://warehouse").parent == Location("s3://warehouse")
    for bad in ("..", ".", "a/../b", "", "%2e%2e", "a\n"):
        with pytest.raises(ValueError):
            root / bad


def test_a_local_warehouse_refuses_a_conditional_replacement(tmp_path: Path) -> None:
    target = Location.local_path(tmp_path) / "f"
    target.create(b"1")
    with pytest.raises(StorageError, match="flock"):
        target.update(b"2", "etag")


def test_s3a_is_configured_from_the_aws_variables() -> None:
    found = s3a_settings(
        {
            "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
            "AWS_ACCESS_KEY_ID": "id",
            "AWS_SECRET_ACCESS_KEY": "secret",
            "AWS_DEFAULT_REGION": "eu-west-1",
            "HOME": "/home/someone",
        }
    )
    assert found == {
        "fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        "fs.s3a.endpoint": "http://127.0.0.1:9000",
        "fs.s3a.path.style.access": "true",
        "fs.s3a.connection.ssl.enabled": "false",
        "fs.s3a.endpoint.region": "eu-west-1",
        "fs.s3a.access.key": "id",
        "fs.s3a.secret.key": "secret",
    }
    https = s3a_settings({"AWS_ENDPOINT_URL": "https://s3.example.com", "AWS_REGION": "x"})
    assert https["fs.s3a.connection.ssl.enabled"] == "true"
    assert https["fs.s3a.endpoint.region"] == "x"
    assert "fs.s3a.access.key" not in https  # S3A's own chain: an instance profile
    assert s3a_settings({}) == {"fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem"}
    temporary = s3a_settings(
        {"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b", "AWS_SESSION_TOKEN": "t"}
    )
    assert temporary["fs.s3a.session.token"] == "t"
    assert temporary["fs.s3a.aws.credentials.provider"].endswith("TemporaryAWSCredentialsProvider")
