"""What a warehouse may be called, and how its locations compose."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.errors import ConfigError
from jobs.warehouse import Location, StorageError


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
