"""Seeding Spark's state at a cut: state rows fed back in as contributions.

A maintenance operation writes the snapshot it restarts from (the Delta ``state``
table at a batch boundary, or a backfill's result) to a Parquet file. The next
run of the new epoch unions ``platform_seed``, a one-shot stream of those rows,
with Kafka: the aggregation absorbs them in the epoch's first batch exactly like
records (counts and sums add, min and max combine), while Kafka is held back
until that batch is committed (with a window, Spark's commit log then holds the
watermark the seeded windows moved it on to, which Kafka's first batch runs with).
Batch 1 first checks Spark's state store against the snapshot,
before any record is processed, as Kafka Streams finishes restoring before it
resumes. A window's row is seeded at the start of the pane Spark keys it by
(``state_seed.seed_time``): a tumbling window's start, a hopping window's last pane,
so that it lands in that window only, and Spark's state key starts at the seed
row's ``_event_time`` (the check compares them). Caveat: the watermark after a
seed is the newest seeded window start minus the delay, at most one window behind
the old epoch's.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.readwriter import DataStreamWriter

from jobs.errors import ConfigError, ConsistencyError
from jobs.private_dir import private_dir
from jobs.resolution import Resolved
from jobs.state_seed import RECORDS, contribution
from jobs.streaming import offset_log
from jobs.warehouse import Location

log = logging.getLogger(__name__)

# The JVM sources (include/jvm/sources/platform/streaming/SeedSources.java): no
# Python process starts for them; offsets as the Python sources before them wrote.
FORMAT = "platform.streaming.SeedSources$Seed"
HOLD_FORMAT = "platform.streaming.SeedSources$Hold"


def seed_stream(spark: SparkSession, resolved: Resolved, path: Location) -> DataFrame:
    """A one-shot stream of the snapshot's rows (the epoch's first batch)."""
    return (
        spark.readStream.format(FORMAT)
        .option("path", path.spark_uri)
        .option("schema", resolved.seed_ddl)
        .load()
    )


def hold_stream(spark: SparkSession, starting_offsets_json: str) -> DataFrame:
    """Kafka's stand-in while the seed is absorbed: no records, and the cut's offsets
    in the shape of Spark's Kafka source, which resumes from them (same checkpoint,
    same position in the query) once the seed batches are committed."""
    return (
        spark.readStream.format(HOLD_FORMAT).option("startingOffsets", starting_offsets_json).load()
    )


# What Spark's state reader finds by name: it turns its path into a URI and back,
# escaping it twice, so a folder named with a space, '%', '#' or any Unicode is not
# found ("No committed batch found").
URI_SAFE = re.compile(r"^[A-Za-z0-9/._=+,:@~-]*$")


@contextmanager
def _state_reader_path(checkpoint: Location, local: bool) -> Iterator[str]:
    """``checkpoint`` as the state reader can find it: itself, or (``local``: the
    executors share the driver's disk) a link with a plain name in this user's own
    folder."""
    if URI_SAFE.fullmatch(checkpoint.spark_uri):
        yield checkpoint.spark_uri
        return
    if not local:
        raise ConfigError(
            f"the checkpoint {checkpoint} has a character Spark's state reader cannot "
            "find on a cluster (a space, '%', '#' or non-ASCII): use a warehouse path "
            "of letters, digits and ._-/"
        )
    folder = Path(tempfile.mkdtemp(prefix="seed-", dir=private_dir("state")))
    try:
        link = folder / "checkpoint"
        if not URI_SAFE.fullmatch(str(link)):
            raise ConfigError(
                f"{link}: the temporary directory's path has a character Spark's state "
                "reader cannot find: set TMPDIR to a path of letters, digits and ._-/"
            )
        os.symlink(checkpoint, link)
        yield str(link)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def verify_seeded_state(
    spark: SparkSession, resolved: Resolved, checkpoint: Location, path: Location
) -> int:
    local = str(spark.sparkContext.master).startswith("local")
    with _state_reader_path(checkpoint, local) as readable:
        return _verify_seeded_state(spark, resolved, readable, path)


def _verify_seeded_state(
    spark: SparkSession, resolved: Resolved, checkpoint: str, path: Location
) -> int:
    """Spark's state after the seed batch (batch 0) must equal the snapshot, row by row.

    Called when batch 1 starts (the state reader needs batch 0 committed). Compared
    in Spark, by position: the aggregate buffers are all named "sum", "min", "max",
    "buf". A buffer is what the seed contributed, except that a decimal sum also
    keeps an "isEmpty" flag, and a distinct count keeps two sketches (records',
    seeds') whose union holds what the seeded one held: compared by estimate, as
    the bytes of equal sketches can differ.
    """
    state = spark.read.format("statestore").option("batchId", 0).load(checkpoint)
    key_fields = state.schema["key"].dataType.fieldNames()  # type: ignore[attr-defined]
    value_type = state.schema["value"].dataType
    # Casting a struct is positional: it gives the "sum", "sum", ... buffers unique names.
    renamed = ", ".join(
        f"v{i}: {f.dataType.simpleString()}"
        for i, f in enumerate(value_type.fields)  # type: ignore[attr-defined]
    )
    buffers = F.col("value").cast(f"struct<{renamed}>")
    columns = [
        F.col(f"key.`{k}`.start") if k == "window" else F.col(f"key.`{k}`") for k in key_fields
    ]
    pipeline = resolved.pipeline
    seed = spark.read.parquet(path.spark_uri)
    wanted = [F.col(f"`{k}`") for k in pipeline.keys]
    if pipeline.window is not None:
        wanted.append(F.col("_event_time"))
    types = resolved.contributions
    at = 0
    for agg in pipeline.aggregations:
        seeded = F.col(contribution(agg))
        if agg.function == "approx_count_distinct":
            union = F.hll_union(buffers.getField(f"v{at}"), buffers.getField(f"v{at + 1}"))
            columns.append(F.hll_sketch_estimate(union))
            wanted.append(F.hll_sketch_estimate(seeded))
            at += 2
        else:
            columns.append(buffers.getField(f"v{at}"))
            wanted.append(seeded)
            decimal_sum = agg.function in ("sum", "avg") and types[contribution(agg)].startswith(
                "decimal"
            )
            at += 2 if decimal_sum else 1
    columns.append(buffers.getField(f"v{at}"))  # _records
    wanted.append(F.col(RECORDS))
    if at + 1 != len(value_type.fields):  # type: ignore[attr-defined]
        raise ConsistencyError(
            f"Spark's state has {len(value_type.fields)} aggregate buffers, the pipeline "  # type: ignore[attr-defined]
            f"{at + 1}: the stream does not resume"
        )
    return _compare_as_multisets(state.select(*columns), seed.select(*wanted))


def _compare_as_multisets(got: DataFrame, want: DataFrame) -> int:
    """The number of rows of ``got``; ConsistencyError unless ``got`` and ``want``
    (the same columns by position) hold the same rows, each as many times."""
    names = [f"c{i}" for i in range(len(got.columns))]
    # Both sides as multisets in one job (the state store is read once): each
    # distinct row's count in Spark minus its count in the snapshot (grouping
    # compares nulls as equal, as exceptAll does).
    both = (
        got.toDF(*names)
        .withColumn("_n", F.lit(1))
        .unionByName(want.toDF(*names).withColumn("_n", F.lit(-1)))
    )
    rows = both.groupBy(*names).agg(
        F.sum("_n").alias("_diff"), F.count_if(F.col("_n") > 0).alias("_got")
    )
    totals = rows.agg(
        F.sum("_got").alias("got"),
        F.sum(F.col("_got") - F.col("_diff")).alias("want"),
        F.count_if(F.col("_diff") != 0).alias("differ"),
    ).first()
    got_rows = int(totals["got"] or 0) if totals is not None else 0
    if totals is not None and totals["differ"]:
        differ = rows.where(F.col("_diff") != 0)
        missing = [tuple(r)[:-2] for r in differ.where(F.col("_diff") < 0).limit(3).collect()]
        extra = [tuple(r)[:-2] for r in differ.where(F.col("_diff") > 0).limit(3).collect()]
        raise ConsistencyError(
            f"the rebuilt Spark state ({got_rows} rows) differs from the Delta snapshot "
            f"({int(totals['want'] or 0)} rows), e.g. {missing} not in Spark {extra}; "
            "the stream does not resume"
        )
    return got_rows


# A seeded epoch's checkpoint once its seed batch is committed (absorb_seed).
SEEDED_MARK = "_platform_seeded"


def absorb_seed(writer: DataStreamWriter, checkpoint: Location) -> None:
    """The seeded epoch's first query: the seed batch, with Kafka held at the cut.
    A mark in the checkpoint says it is done: the next query of the checkpoint
    reads Kafka from the cut (the hold stood in its place with the same offsets)."""
    running = writer.trigger(processingTime="200 milliseconds").start()
    try:
        while running.isActive and not offset_log.committed_batches(checkpoint):
            time.sleep(0.1)
        if running.exception() is not None:
            raise ConsistencyError(f"seeding the epoch's state failed: {running.exception()}")
    finally:
        running.stop()
    (checkpoint / SEEDED_MARK).write_bytes(b"")
    log.info("seed absorbed in %s; Kafka resumes from the cut", checkpoint)
