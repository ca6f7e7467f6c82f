"""A dimension's definition (include/dimensions/*.yaml), checked without Spark."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jobs.dimension_load import load_dimension, load_each_dimension, parse_dimension
from jobs.errors import ConfigError
from jobs.settings import REPO_ROOT

GOOD: dict[str, Any] = {
    "name": "merchants",
    "source": "${warehouse}/incoming/merchants.jsonl",
    "key": "id",
    "columns": {"id": "string", "since": "timestamp", "score": "decimal(10, 2)"},
}


def test_the_shipped_dimension_loads() -> None:
    (merchants,), broken = load_each_dimension(REPO_ROOT / "include" / "dimensions")
    assert broken == {}
    assert merchants.name == "merchants" and merchants.key == "id"
    assert merchants.table(Path("/w")) == Path("/w/dims/merchants")
    assert merchants.source_file(Path("/w")) == Path("/w/incoming/merchants.jsonl")


def test_columns_are_spark_types_in_order() -> None:
    dimension = parse_dimension(GOOD, "test")
    assert dimension.ddl() == "`id` string, `since` timestamp, `score` decimal(10,2)"
    assert dimension.schedule_minutes is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"name": "Merchants!"}, "name: must be lower case"),
        ({"source": "${warehouse}/../etc/passwd"}, "source: must be an absolute path"),
        ({"source": "relative/file.jsonl"}, "source: must be an absolute path"),
        ({"source": "/data/merchants-*.jsonl"}, "no glob or scheme characters"),
        ({"source": "/data/s3:merchants.jsonl"}, "no glob or scheme characters"),
        ({"columns": {"id": "array<string>"}}, "key: 'id' is a array<string>: a key must be"),
        ({"key": "code"}, "key: 'code' is not one of the columns (id, since, score)"),
        ({"columns": {"id": "strin g"}}, "type of 'id'"),
        ({"columns": {"1id": "string"}}, "field name '1id' must start with a letter"),
        ({"schedule_minutes": 0}, "schedule_minutes: must be 1..10080"),
        ({"owner": "me"}, "unknown field(s) owner"),
    ],
)
def test_a_bad_definition_is_one_error_naming_the_field(
    change: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as error:
        parse_dimension({**GOOD, **change}, "merchants.yaml")
    assert str(error.value).startswith("merchants.yaml: ") and message in str(error.value)


def test_a_name_that_is_no_file_lists_the_defined_ones(tmp_path: Path) -> None:
    (tmp_path / "stores.yaml").write_text("name: stores\n")
    with pytest.raises(
        ConfigError, match=r"no dimension file .*merchants.yaml \(defined dimensions: stores\)"
    ):
        load_dimension("merchants", tmp_path)
    with pytest.raises(ConfigError, match="is not a valid name"):
        load_dimension("../x", tmp_path)


def test_a_file_names_its_dimension_and_one_broken_file_spares_the_others(tmp_path: Path) -> None:
    import yaml

    (tmp_path / "merchants.yaml").write_text(yaml.safe_dump(GOOD))
    (tmp_path / "shops.yaml").write_text(yaml.safe_dump(GOOD))  # name: merchants
    loaded, broken = load_each_dimension(tmp_path)
    assert [d.name for d in loaded] == ["merchants"]
    assert "name: must be the file's name 'shops', got 'merchants'" in str(broken["shops"])


def test_no_application_takes_the_dimension_tables_folder() -> None:
    from jobs.pipeline.parser import parse_pipeline

    with pytest.raises(ConfigError, match="'dims' is the warehouse's folder of dimension tables"):
        parse_pipeline(
            {
                "application_id": "dims",
                "source": {"topics": ["t"]},
                "schema": {"a": "string"},
                "keys": ["a"],
                "event_time": {"field": "kafka.timestamp"},
                "aggregations": [{"name": "n", "function": "count"}],
            },
            "dims.yaml",
        )


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("65536", 65536), ("64k", 64 * 1024), ("64M", 64 * 1024 * 1024), ("1g", 1024**3)],
)
def test_the_dimension_size_limit_reads_as_spark_writes_sizes(  # type: ignore[no-untyped-def]
    monkeypatch, raw: str, expected: int
) -> None:
    from jobs.settings import load_settings

    monkeypatch.setenv("PLATFORM_DIMENSION_MAX_BYTES", raw)
    assert load_settings().dimension_max_bytes == expected


@pytest.mark.parametrize("raw", ["0", "-1", "64mb", "1.5g", "", "k", "2g", "٣m"])
def test_a_bad_dimension_size_limit_is_refused(monkeypatch, raw: str) -> None:  # type: ignore[no-untyped-def]
    from jobs.errors import ConfigError
    from jobs.settings import load_settings

    monkeypatch.setenv("PLATFORM_DIMENSION_MAX_BYTES", raw)
    with pytest.raises(ConfigError, match="PLATFORM_DIMENSION_MAX_BYTES must be a size"):
        load_settings()


def test_sizes_read_in_messages_as_people_write_them() -> None:
    from jobs.settings import size_text

    assert [size_text(n) for n in (512, 4096, 1536, 64 * 2**20, 3 * 2**29)] == [
        "512 bytes",
        "4 KiB",
        "1.5 KiB",
        "64 MiB",
        "1.5 GiB",
    ]
