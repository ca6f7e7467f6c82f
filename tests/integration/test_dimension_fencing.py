"""A dimension load on S3 that wakes after another loader took its lease over writes
nothing: its commit carries its lease generation, which Delta refuses in the
snapshot it commits on, and every Delta-spark log entry on S3 is created
put-if-absent by the store (``ConditionalS3LogStore``), so two drivers never both
write one version."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
from deltalake import DeltaTable

from jobs.dimension_load import Dimension, _commit, read_checked, refresh
from jobs.errors import LeaseLostError
from jobs.warehouse import Location

pytestmark = pytest.mark.integration
DIMENSION = Dimension(
    "merchants",
    "",
    "${warehouse}/incoming/merchants.jsonl",
    "id",
    {"id": "string", "category": "string"},
    None,
)


@dataclass
class PausedHolder:
    """A loader's hold as it was before its pause: its check passed then."""

    generation: int | None

    def check(self) -> None:
        return None


def write_source(warehouse: Location, categories: dict[str, str]) -> None:
    lines = [json.dumps({"id": k, "category": v}) for k, v in sorted(categories.items())]
    DIMENSION.source_file(warehouse).write_text("\n".join(lines) + "\n")


def rows(warehouse: Location) -> dict[str, str]:
    table = DeltaTable(str(DIMENSION.table(warehouse))).to_pyarrow_table().to_pylist()
    return {r["id"]: r["category"] for r in table}


def test_a_loader_woken_after_a_takeover_writes_nothing(  # type: ignore[no-untyped-def]
    spark, s3_warehouse: Location
) -> None:
    write_source(s3_warehouse, {"m1": "books"})
    assert refresh(spark, DIMENSION, s3_warehouse).version == 0  # lease generation 1
    write_source(s3_warehouse, {"m1": "games"})
    assert refresh(spark, DIMENSION, s3_warehouse).version == 1  # generation 2
    write_source(s3_warehouse, {"m1": "stale"})
    stale = read_checked(spark, DIMENSION, DIMENSION.source_file(s3_warehouse))
    try:
        with pytest.raises(LeaseLostError, match=r"a newer load .* wrote nothing"):
            _commit(
                spark, DIMENSION, s3_warehouse, stale.drop("_corrupt_record"), 1, PausedHolder(1)
            )
    finally:
        stale.unpersist()
    assert rows(s3_warehouse) == {"m1": "games"}
    assert DeltaTable(str(DIMENSION.table(s3_warehouse))).version() == 1


def test_a_delta_log_entry_on_s3_is_created_only_if_absent(  # type: ignore[no-untyped-def]
    spark, s3_warehouse: Location
) -> None:
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.delta.logStore.s3a.impl") == "platform.streaming.ConditionalS3LogStore"
    jvm = spark._jvm
    hadoop = spark._jsparkSession.sessionState().newHadoopConf()
    store = jvm.platform.streaming.ConditionalS3LogStore(hadoop)
    entry = s3_warehouse / "t" / "_delta_log" / f"{0:020d}.json"
    path = jvm.org.apache.hadoop.fs.Path(entry.spark_uri)

    def write(line: str) -> Any:
        return store.write(path, jvm.java.util.List.of(line).iterator(), False, hadoop)

    write('{"commitInfo":{"by":"first"}}')
    with pytest.raises(Exception, match="FileAlreadyExistsException"):
        write('{"commitInfo":{"by":"second"}}')
    assert entry.read_text() == '{"commitInfo":{"by":"first"}}\n'
