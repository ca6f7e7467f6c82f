"""How the ``state`` table's file layout, the merge's condition and the engine
change the cost of one batch's MERGE as the state grows.

    .venv/bin/python -m benchmarks.state_layout [--sizes 200000,2000000,10000000]

Windowed state (``user_clicks``): 1,000 rows of the newest windows merged into N
(user, minute) rows over 30 days. Layouts: one_file (what merges leave when every
batch touches every file); time_clustered (files of 250,000 rows in window order:
what appends and merges of recent windows produce, and what ``maintain``'s
compaction keeps); by_date (partitioned by the window's date, an extra column).
Conditions: the keys alone, or the keys and the batch's window range (what the
platform's merge adds, ``jobs/delta/writer.window_range``).

Unwindowed state (``inventory``): 1,000 random existing keys of N. Layouts:
one_file; arrival_files (files of 250,000 rows as keys arrived); key_sorted
(files of 250,000 rows sorted by key: what a Z-order on the key makes);
key_buckets (partitioned by a hash bucket of the key, 16 buckets).

delta-rs runs in this process; delta-spark is ``DeltaTable.merge`` in a warm
local[2] session (the source a cached 1,000-row frame), deletion vectors off and
on. Median of 3 merges, seconds. Writes its section of docs/benchmarks.md. Not a
test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake

from benchmarks.report import machine, write_section
from jobs.delta.writer import window_range

TS = pa.timestamp("us", tz="UTC")
DAY_US = 86_400_000_000
MINUTE_US = 60_000_000
FILE_ROWS = 250_000
BUCKETS = 16
WINDOWED = ("one_file", "time_clustered", "by_date")
UNWINDOWED = ("one_file", "arrival_files", "key_sorted", "key_buckets")
# (label, engine, condition, deletion vectors) of each column group
WINDOWED_RUNS = (
    ("delta-rs, keys", "rs", "keys", None),
    ("delta-rs, keys and window range (platform)", "rs", "range", None),
    ("delta-spark, keys and window range, DVs off", "spark", "range", "false"),
    ("delta-spark, keys and window range, DVs on", "spark", "range", "true"),
)
UNWINDOWED_RUNS = (
    ("delta-rs (platform)", "rs", "keys", None),
    ("delta-spark, DVs off", "spark", "keys", "false"),
    ("delta-spark, DVs on", "spark", "keys", "true"),
)


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


def unwindowed_rows(n: int, rng: np.random.Generator) -> pa.Table:
    """N distinct keys in arrival order (random), with a bucket column."""
    ids = rng.permutation(n)
    return pa.table(
        {
            "sku": pa.array([f"sku-{i:09d}" for i in ids], pa.string()),
            "quantity": pa.array(rng.integers(0, 1000, n), pa.int64()),
            "bucket": pa.array((ids % BUCKETS).astype("int32"), pa.int32()),
        }
    )


def build(path: str, data: pa.Table, layout: str, partition: str) -> None:
    if layout == "one_file":
        write_deltalake(path, data.drop([partition]))
    elif layout in ("by_date", "key_buckets"):
        write_deltalake(path, data, partition_by=[partition])
    else:
        if layout == "key_sorted":
            data = data.sort_by(data.column_names[0])
        for start in range(0, data.num_rows, FILE_ROWS):
            write_deltalake(path, data.slice(start, FILE_ROWS).drop([partition]), mode="append")


def rs_merge(path: str, source: pa.Table, predicate: str) -> float:
    started = time.monotonic()
    (
        DeltaTable(path)
        .merge(source, predicate, source_alias="s", target_alias="t")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute()
    )
    return time.monotonic() - started


def spark_merge(spark: Any, path: str, source: pa.Table, predicate: str) -> float:
    from delta.tables import DeltaTable as SparkDeltaTable

    frame = spark.createDataFrame(source.to_pandas()).cache()
    frame.count()
    started = time.monotonic()
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


def spark_range(source: pa.Table) -> str:
    low, high = (v.value for v in pc.min_max(source["window_start"]).values())
    return f"t.window_start BETWEEN timestamp_micros({low}) AND timestamp_micros({high})"


def measure_layouts(
    work: Path,
    spark: Any,
    data: pa.Table,
    source: pa.Table,
    keys: list[str],
    layouts: tuple[str, ...],
    runs: tuple[tuple[str, str, str, str | None], ...],
    partition: str,
    within: Callable[[pa.Table, str], str | None],
) -> dict[tuple[str, str], float]:
    result: dict[tuple[str, str], float] = {}
    for layout in layouts:
        path = str(work / layout)
        build(path, data, layout, partition)
        partitioned = layout in ("by_date", "key_buckets")
        layout_keys = [partition, *keys] if partitioned else keys
        batch = source if partitioned else source.drop([partition])
        on_keys = " AND ".join(f"t.`{k}` = s.`{k}`" for k in layout_keys)
        for label, engine, condition, dvs in runs:
            if engine == "spark" and spark is None:
                continue
            extra = within(batch, engine) if condition == "range" else None
            predicate = on_keys if extra is None else f"{on_keys} AND {extra}"
            if engine == "rs":
                seconds = [rs_merge(path, batch, predicate) for _ in range(3)]
            else:
                spark.sql(
                    f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES "
                    f"('delta.enableDeletionVectors' = '{dvs}')"
                )
                seconds = [spark_merge(spark, path, batch, predicate) for _ in range(3)]
            result[(label, layout)] = statistics.median(seconds)
        shutil.rmtree(path, ignore_errors=True)
    return result


def windowed_within(batch: pa.Table, engine: str) -> str | None:
    if engine == "spark":
        return spark_range(batch)
    return window_range("window_start", batch["window_start"])


def measure(n: int, work: Path, spark: Any) -> dict[str, dict[tuple[str, str], float]]:
    rng = np.random.default_rng(1)
    rows = windowed_rows(n, rng, int(time.time() * 1_000_000))
    batch = rows.slice(n - 1000, 1000)  # the newest windows, as a batch touches
    batch = batch.set_column(3, "clicks", pc.add(batch["clicks"], 1))
    windowed = measure_layouts(
        work,
        spark,
        rows,
        batch,
        ["user_id", "window_start", "window_end"],
        WINDOWED,
        WINDOWED_RUNS,
        "window_date",
        windowed_within,
    )
    del rows
    stock = unwindowed_rows(n, rng)
    picked = stock.take(pa.array(rng.choice(n, 1000, replace=False)))
    picked = picked.set_column(1, "quantity", pc.add(picked["quantity"], 1))
    unwindowed = measure_layouts(
        work,
        spark,
        stock,
        picked,
        ["sku"],
        UNWINDOWED,
        UNWINDOWED_RUNS,
        "bucket",
        lambda _batch, _engine: None,
    )
    return {"windowed": windowed, "unwindowed": unwindowed}


def table(
    results: dict[int, dict[str, dict[tuple[str, str], float]]],
    kind: str,
    layouts: tuple[str, ...],
    runs: tuple[tuple[str, str, str, str | None], ...],
) -> list[str]:
    lines = [
        f"| state rows | engine, condition | {' | '.join(layouts)} |",
        "|---|---|" + "---|" * len(layouts),
    ]
    for n, by_kind in results.items():
        for label, *_ in runs:
            cells = [by_kind[kind].get((label, layout)) for layout in layouts]
            if all(c is None for c in cells):
                continue
            shown = " | ".join("-" if c is None else f"{c:.2f}" for c in cells)
            lines.append(f"| {n:,} | {label} | {shown} |")
    return lines


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

        spark = get_spark("local[2]", "bench-state-layout", "6g")
    try:
        results = {int(n): measure(int(n), work, spark) for n in args.sizes.split(",")}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    lines = [
        "## State layout: one batch's MERGE, delta-rs and delta-spark",
        "",
        f"Command: `.venv/bin/python -m benchmarks.state_layout --sizes {args.sizes}`",
        "",
        f"Machine: {machine()}. One 1,000-row MERGE into a state of N rows; median of 3 "
        "merges, seconds. delta-rs runs in the driver's process; delta-spark is "
        "`DeltaTable.merge` in a warm `local[2]` session (the source a cached 1,000-row "
        "frame). The layouts and conditions are described in `benchmarks/state_layout.py`.",
        "",
        "Windowed state (`user_clicks`: 1,000 rows of the newest windows; 30 days, 100,000 users):",
        "",
        *table(results, "windowed", WINDOWED, WINDOWED_RUNS),
        "",
        f"Unwindowed state (`inventory`: 1,000 random existing keys; {BUCKETS} buckets):",
        "",
        *table(results, "unwindowed", UNWINDOWED, UNWINDOWED_RUNS),
    ]
    report = "\n".join(lines) + "\n"
    print(report)
    if not args.no_write:
        write_section(report)


if __name__ == "__main__":
    main()
