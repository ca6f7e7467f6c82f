"""The reference pipeline with its batch half, end to end: the merchants dimension
loaded from its sample file by the ``dimension`` job, ``orders_by_category``
enriching orders from it, a fix of the file, and ``backfill --dimensions newest``
publishing exactly the changed windows. Expectations are plain Python over the
same orders and the file's rows."""

from __future__ import annotations

import calendar
import dataclasses
import json
import time
from collections import defaultdict
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from deltalake import DeltaTable

from include import sample_data
from jobs import kafka_admin
from jobs.settings import REPO_ROOT
from tests.conftest import run_in_process, run_jobs
from tests.output_topic import read_output

pytestmark = pytest.mark.integration
APP = "orders_by_category"
Key = tuple[str, int]  # category, window start (epoch seconds)


def merchants(path: Path) -> dict[str, dict[str, str]]:
    return {row["id"]: row for row in map(json.loads, path.read_text().splitlines())}


def expected(events: list[dict[str, Any]], dims: dict[str, dict[str, str]]) -> dict[Key, Any]:
    """Per category and 10-minute window of paid orders of real shops: revenue,
    orders and distinct regions of the merchants the table names."""
    revenue: dict[Key, Decimal] = defaultdict(Decimal)
    orders: dict[Key, int] = defaultdict(int)
    regions: dict[Key, set[str]] = defaultdict(set)
    for e in events:
        if e["status"] != "paid" or e["merchant"]["country"] == "XX":
            continue
        row = dims[e["merchant"]["id"]]
        created = calendar.timegm(time.strptime(e["created_at"], "%Y-%m-%dT%H:%M:%SZ"))
        key = (row["category"], created - created % 600)
        revenue[key] += Decimal(e["amount_cents"]) / 100
        orders[key] += 1
        regions[key].add(row["region"])
    return {k: (revenue[k], orders[k], len(regions[k])) for k in orders}


def state(warehouse: Path) -> dict[Key, Any]:
    rows = DeltaTable(str(warehouse / APP / "state")).to_pyarrow_table().to_pylist()
    return {
        (r["category"], int(r["window_start"].timestamp())): (
            r["revenue"],
            r["orders"],
            r["regions"],
        )
        for r in rows
    }


def dimension(spark: Any, settings: Any) -> str:
    argv = ["dimension", "--dimension", "merchants", "--warehouse", str(settings.warehouse)]
    done = run_in_process(spark, argv)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_the_dimension_feeds_the_stream_and_a_fix_is_backfilled(  # type: ignore[no-untyped-def]
    spark, broker, settings, kafka_config, new_topic, tmp_path, s3_warehouse
) -> None:
    """On the bucket: the dimension's file, its table (Spark writes it under the
    table's lease), the stream and the backfill all on S3."""
    settings = dataclasses.replace(settings, warehouse=s3_warehouse)
    written = tmp_path / "merchants.jsonl"  # the sample file, uploaded where the job reads it

    def upload(*fix: str) -> None:
        assert sample_data.main(["merchants", "--out", str(written), *fix]) == 0
        (s3_warehouse / "incoming" / "merchants.jsonl").write_bytes(written.read_bytes())

    upload()
    source = written
    assert "40 rows, committed version 0" in dimension(spark, settings)
    assert "unchanged at version 0" in dimension(spark, settings)  # no version for nothing

    topic = new_topic(2)
    now_s = int(time.time())
    events = list(sample_data.order_events(800, 40, 60, 3, now_s - 3600, 3600))
    records = sample_data.encoded(iter(events), sample_data.BAD_ORDERS, 0, "buyer")
    kafka_admin.produce_all(kafka_config, topic, records)
    data = yaml.safe_load((REPO_ROOT / "include" / "pipelines" / f"{APP}.yaml").read_text())
    data["source"]["topics"] = [topic]
    data["output"] = {"topic": f"out_{topic}", "partitions": 2}
    pipeline = tmp_path / f"{APP}.yaml"
    pipeline.write_text(yaml.safe_dump(data))
    assert run_jobs(pipeline, settings, "run", spark=spark).returncode == 0
    before = expected(events, merchants(source))
    assert state(settings.warehouse) == before
    # The run left Spark's answers for the tools without a JVM: the derived columns'
    # types and the table the enrichment reads.
    from jobs import resolution
    from jobs.delta.layout import AppLayout
    from jobs.pipeline.parser import load_pipeline

    stored = resolution.load_stored(
        AppLayout(settings.warehouse, APP), load_pipeline(str(pipeline), tmp_path)
    )
    assert stored.analysed and not stored.uses_headers
    assert stored.column_type("category") == "string"
    assert stored.dimensions["shop"].path == str(settings.warehouse / "dims" / "merchants")
    assert '"category"' in stored.dimensions["shop"].row_type

    # The fix: two merchants were in the wrong category.
    dims = merchants(source)
    moved = {
        m: "garden" if dims[m]["category"] != "garden" else "books" for m in ("M-001", "M-006")
    }
    upload(*(f"--category={m}={c}" for m, c in moved.items()))
    assert "committed version 1" in dimension(spark, settings)
    after = expected(events, merchants(source))
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    assert changed

    # The batch job aggregates in another order than the stream did (other
    # partitions): a distinct count's sketch of the same values can differ in bytes,
    # which is no change of the window.
    spark.conf.set("spark.sql.shuffle.partitions", "7")
    args = ("backfill", "--from-earliest", "--dimensions", "newest", "--reason", "merchants fix")
    planned = run_jobs(pipeline, settings, *args, "--preview", spark=spark)
    assert planned.returncode == 0, planned.stderr[-2000:]
    assert "shop 0 -> 1" in planned.stdout, planned.stdout[-2000:]
    assert state(settings.warehouse) == before  # a preview publishes nothing
    applied = run_jobs(pipeline, settings, *args, spark=spark)
    assert applied.returncode == 0, applied.stderr[-2000:]
    assert state(settings.warehouse) == after

    # The output topic: the first run's windows, then one correction per changed
    # window (a window left empty: a tombstone), once; read as a table, the state.
    published = read_output(kafka_config, f"out_{topic}")
    corrections = [r for r in published if r["headers"]["platform.kind"] == "correction"]

    def key(record: dict[str, Any]) -> Key:
        start = record["key"]["window_start"]
        moment = time.strptime(start[:19], "%Y-%m-%dT%H:%M:%S")
        return record["key"]["category"], calendar.timegm(moment)

    assert sorted(map(key, corrections)) == sorted(changed)
    table: dict[Key, int] = {}
    for record in published:
        if record["value"] is None:
            table.pop(key(record), None)
        else:
            table[key(record)] = record["value"]["aggregates"]["orders"]
    assert table == {k: v[1] for k, v in after.items()}


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (['{"id": "M-1", "name": "a", "category": "x", "region": "y"}'] * 2, "'M-1' is on 2 rows"),
        (['{"id": "M-1", "name": "a"', ""], "1 line(s) do not parse"),
        (['{"name": "a", "category": "x", "region": "y"}'], "1 row(s) with no id"),
    ],
)
def test_a_file_the_table_cannot_take_is_one_error_and_nothing_written(  # type: ignore[no-untyped-def]
    spark, settings, rows: list[str], message: str
) -> None:
    source = Path(settings.warehouse) / "incoming" / "merchants.jsonl"
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_text("\n".join(rows) + "\n")
    argv = ["dimension", "--dimension", "merchants", "--warehouse", str(settings.warehouse)]
    failed = run_in_process(spark, argv)
    assert failed.returncode == 2, failed.stderr[-2000:]
    assert failed.stderr.startswith("error: dimension merchants: ") and message in failed.stderr
    assert failed.stderr.count("\n") == 1, failed.stderr
    assert not (settings.warehouse / "dims" / "merchants").exists()


def test_a_file_past_the_streams_size_limit_is_refused_before_it_is_written(  # type: ignore[no-untyped-def]
    spark, settings, monkeypatch
) -> None:
    source = Path(settings.warehouse) / "incoming" / "merchants.jsonl"
    source.parent.mkdir(parents=True, exist_ok=True)
    # 40 rows of about 230 bytes as JSON: 9 KiB, past a 4 KiB limit.
    rows = [
        json.dumps({"id": f"M-{i}", "name": "n" * 180, "category": "books", "region": "eu"})
        for i in range(40)
    ]
    source.write_text("\n".join(rows) + "\n")
    argv = ["dimension", "--dimension", "merchants", "--warehouse", str(settings.warehouse)]
    monkeypatch.setenv("PLATFORM_DIMENSION_MAX_BYTES", "4k")
    failed = run_in_process(spark, argv)
    assert failed.returncode == 2, failed.stderr[-2000:]
    assert failed.stderr.startswith("error: dimension merchants: ")
    assert "past PLATFORM_DIMENSION_MAX_BYTES (4 KiB)" in failed.stderr, failed.stderr
    assert failed.stderr.count("\n") == 1, failed.stderr
    assert not (settings.warehouse / "dims" / "merchants").exists()
    monkeypatch.delenv("PLATFORM_DIMENSION_MAX_BYTES")  # the default: loaded
    assert run_in_process(spark, argv).returncode == 0
    loaded = DeltaTable(str(settings.warehouse / "dims" / "merchants")).to_pyarrow_table()
    assert loaded.num_rows == 40
