"""A backfill recomputes a distinct count's HLL sketch in another order than the
stream merged it: the same values can serialize to other bytes. That is no change
of the window (no MERGE update, no correction); other values are one, even when
the estimate is the same."""

from __future__ import annotations

import pyarrow as pa
import pytest

from jobs.operations.backfill import same_sketches_kept
from jobs.pipeline.parser import parse_pipeline

pytestmark = pytest.mark.integration


def sketch(spark, values: list[str]) -> bytes:  # type: ignore[no-untyped-def]
    rows = ", ".join(f"('{v}')" for v in values)
    query = (
        "SELECT hll_union(s, s) AS s FROM "
        f"(SELECT hll_sketch_agg(v, 12) AS s FROM VALUES {rows} AS t(v))"
    )
    return bytes(spark.sql(query).first()["s"])


def test_the_same_values_in_other_bytes_are_no_change(spark) -> None:  # type: ignore[no-untyped-def]
    pipeline = parse_pipeline(
        {
            "application_id": "regions",
            "source": {"topics": ["orders"]},
            "schema": {"category": "string", "region": "string"},
            "keys": ["category"],
            "event_time": {"field": "kafka.timestamp"},
            "aggregations": [
                {"name": "regions", "function": "approx_count_distinct", "field": "region"}
            ],
        },
        "test",
    )
    stream = {"a": ["x", "y", "z"], "b": ["x", "y"], "c": ["x"]}
    batch = {"a": ["z", "x", "y"], "b": ["x", "w"], "c": ["x"], "d": ["q"]}
    assert sketch(spark, stream["a"]) != sketch(spark, batch["a"])  # the same set

    def table(sets: dict[str, list[str]]) -> pa.Table:
        return pa.table(
            {
                "category": list(sets),
                "regions": [len(v) for v in sets.values()],
                "_sketch_regions": [sketch(spark, v) for v in sets.values()],
            }
        )

    current, corrected = table(stream), table(batch)
    kept = same_sketches_kept(spark, pipeline, current, corrected)
    by_key = {r["category"]: r for r in kept.to_pylist()}
    assert set(by_key) == {"a", "b", "c", "d"}
    assert by_key["a"]["_sketch_regions"] == current.column("_sketch_regions")[0].as_py()
    # {x, w} is not {x, y}, whatever the estimate: the recomputed sketch stays.
    assert by_key["b"]["_sketch_regions"] == corrected.column("_sketch_regions")[1].as_py()
    assert by_key["d"]["_sketch_regions"] == corrected.column("_sketch_regions")[3].as_py()
    assert kept.schema == corrected.schema

    # In HLL mode (thousands of values) only equal bytes are the same sketch.
    many = [f"v{i}" for i in range(3000)]
    big_now, big_new = sketch(spark, many), sketch(spark, many[::-1])
    current = pa.table({"category": ["e"], "regions": [3000], "_sketch_regions": [big_now]})
    corrected = pa.table({"category": ["e"], "regions": [3000], "_sketch_regions": [big_new]})
    (row,) = same_sketches_kept(spark, pipeline, current, corrected).to_pylist()
    assert row["_sketch_regions"] == (big_now if big_now == big_new else big_new)
