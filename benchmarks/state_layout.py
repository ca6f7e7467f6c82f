"""How the ``state`` table's file layout, and the engine, change the cost of one
batch's MERGE: 1,000 rows of the newest windows merged into a windowed state of N
rows laid out three ways, by delta-rs (in the driver's process, no Spark) and by
delta-spark (``DeltaTable.merge`` in a warm local[2] session) with deletion
vectors off and on.

    .venv/bin/python -m benchmarks.state_layout [--sizes 200000,2000000,10000000]

one_file: everything in one file (what merges leave behind when every batch
touches every file); time_clustered: files of 250,000 rows in window order (what
appends and merges of recent windows produce); by_date: partitioned by the
window's date (needs an extra column). Writes its section of docs/benchmarks.md.
Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake

from benchmarks.report import machine, write_section

TS = pa.timestamp("us", tz="UTC")
DAY_US = 86_400_000_000
MINUTE_US = 60_000_000
LAYOUTS = ("one_file", "time_clustered", "by_date")


def windowed_rows(n: int, rng: np.random.Generator, now_us: int) -> pa.Table:
    """N (user, minute) windows over 30 days, in time order as a stream makes them."""
    starts = np.sort(now_us - rng.integers(0, 30 * DAY_US // MINUTE_US, n) * MINUTE_US)
    return pa.table(
        {
            "user_id": pa.array([f"u{u}" for u in rng.integers(0, 100_000, n)], pa.string()),
            "window_start": pa.array(starts, TS),
            "window_end": pa.array(starts + MINUTE_US, TS),
            "clicks": pa.array(rng.integers(1, 50, n), pa.int64()),
            "window_date": pa.array((starts // DAY_US).astype("int32"), pa.int32()),
        }
    )


def merge_seconds(path: str, source: pa.Table, keys: list[str]) -> float:
    started = time.monotonic()
    predicate = " AND ".join(f"t.`{k}` = s.`{k}`" for k in keys)
    (
        DeltaTable(path)
        .merge(source, predicate, source_alias="s", target_alias="t")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute()
    )
    return time.monotonic() - started


def spark_merge_seconds(spark: Any, path: str, source: pa.Table, keys: list[str]) -> float:
    from delta.tables import DeltaTable as SparkDeltaTable

    frame = spark.createDataFrame(source.to_pandas()).cache()
    frame.count()
    started = time.monotonic()
    predicate = " AND ".join(f"t.`{k}` = s.`{k}`" for k in keys)
    (
        SparkDeltaTable.forPath(spark, path)
        .alias("t")
        .merge(frame.alias("s"), predicate)
        .whenMatchedUpdateAll()
        .whenNotMatchedInsertAll()
        .execute()
    )
    seconds = time.monotonic() - started
    frame.unpersist()
    return seconds


def measure(n: int, work: Path, spark: Any) -> dict[str, float]:
    rng = np.random.default_rng(1)
    rows = windowed_rows(n, rng, int(time.time() * 1_000_000))
    batch = rows.slice(n - 1000, 1000)  # the newest windows, as a batch touches
    batch = batch.set_column(3, "clicks", pc.add(batch["clicks"], 1))
    result = {}
    for layout in LAYOUTS:
        path = str(work / layout)
        keys = ["user_id", "window_start", "window_end"]
        data, source = rows.drop(["window_date"]), batch.drop(["window_date"])
        if layout == "by_date":
            data, source, keys = rows, batch, ["window_date", *keys]
            write_deltalake(path, data, partition_by=["window_date"])
        elif layout == "time_clustered":
            for start in range(0, n, 250_000):
                write_deltalake(path, data.slice(start, 250_000), mode="append")
        else:
            write_deltalake(path, data)
        result[layout] = statistics.median(merge_seconds(path, source, keys) for _ in range(3))
        if spark is not None:
            for dv in ("false", "true"):
                spark.sql(
                    f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES "
                    f"('delta.enableDeletionVectors' = '{dv}')"
                )
                result[f"{layout}/spark/dv={dv}"] = statistics.median(
                    spark_merge_seconds(spark, path, source, keys) for _ in range(3)
                )
        shutil.rmtree(path, ignore_errors=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="200000,2000000,10000000")
    parser.add_argument("--no-spark", action="store_true", help="delta-rs only")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-layout-"))
    spark = None
    if not args.no_spark:
        from jobs.streaming.spark import get_spark

        spark = get_spark("local[2]", "bench-state-layout", "4g")
    try:
        results = {int(n): measure(int(n), work, spark) for n in args.sizes.split(",")}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    engines = [("delta-rs", "")]
    if spark is not None:
        engines += [
            ("delta-spark, DVs off", "/spark/dv=false"),
            ("delta-spark, DVs on", "/spark/dv=true"),
        ]
    lines = [
        "## State layout: one batch's MERGE, delta-rs and delta-spark",
        "",
        f"Command: `.venv/bin/python -m benchmarks.state_layout --sizes {args.sizes}`",
        "",
        f"Machine: {machine()}. 1,000 rows of the newest windows merged into a windowed "
        "state of N rows (30 days, 100,000 users); median of 3 merges, seconds. "
        "delta-rs runs in the driver's process; delta-spark is `DeltaTable.merge` in a "
        "warm `local[2]` session (the source a cached 1,000-row frame).",
        "",
        "| state rows | engine | one file | time-clustered files | partitioned by date |",
        "|---|---|---|---|---|",
    ]
    for n, r in results.items():
        for engine, suffix in engines:
            cells = " | ".join(f"{r[layout + suffix]:.2f}" for layout in LAYOUTS)
            lines.append(f"| {n:,} | {engine} | {cells} |")
    report = "\n".join(lines) + "\n"
    print(report)
    if not args.no_write:
        write_section(report)


if __name__ == "__main__":
    main()
