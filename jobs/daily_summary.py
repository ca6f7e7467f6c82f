"""A Spark batch job downstream of a pipeline, the worked example of the platform's
batch half: a daily summary of a windowed pipeline's ``state`` table, kept up to
date incrementally and exactly once, with delta-spark only.

``<warehouse>/<application_id>_daily``: one row per day of ``window_start``
(UTC): the state rows (key, window) of that day, its distinct keys, the total of
every ``count`` and ``sum`` aggregation, and the state version it was computed
from.

Each run pins the state's current version, reads the change data feed since the
version the summary last covered, recomputes the days those changes touched from
the state at the pinned version (so a rewind or backfill that rewrote the state
is summarized as it is now, not replayed change by change), and MERGEs them in.
Exactly once with Delta's own marker: the MERGE runs with the session's
``txnAppId`` = ``<application_id>/daily_summary`` and ``txnVersion`` = the
pinned state version, so a run repeated after its commit is skipped by Delta,
and one that died before it redoes the same work.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from deltalake import DeltaTable as RsDeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.delta.layout import AppLayout
from jobs.errors import ConfigError, ConsistencyError
from jobs.lock import table_lock
from jobs.pipeline.model import Pipeline
from jobs.settings import Settings
from jobs.warehouse import Location

log = logging.getLogger(__name__)
SUFFIX = "_daily"
TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"


def summary_path(settings: Settings, pipeline: Pipeline) -> Location:
    return settings.warehouse / f"{pipeline.application_id}{SUFFIX}"


def txn_app_id(pipeline: Pipeline) -> str:
    return f"{pipeline.application_id}/daily_summary"


def summarized_version(path: Location, pipeline: Pipeline) -> int | None:
    """The state version the summary covers (its Delta marker), or None."""
    if not RsDeltaTable.is_deltatable(str(path)):
        return None
    version = RsDeltaTable(str(path)).transaction_version(txn_app_id(pipeline))
    return None if version is None else int(version)


def daily_rows(pipeline: Pipeline, state: DataFrame, version: int) -> DataFrame:
    totals = [
        F.sum(a.name).alias(f"{a.name}_total")
        for a in pipeline.aggregations
        if a.function in ("count", "sum")
    ]
    return (
        state.groupBy(F.to_date("window_start").alias("day"))
        .agg(
            F.count(F.lit(1)).alias("state_rows"),
            F.countDistinct(*(F.col(f"`{k}`") for k in pipeline.keys)).alias("distinct_keys"),
            *totals,
        )
        .withColumn("state_version", F.lit(version).cast("long"))
    )


def touched_days(
    spark: SparkSession, state_path: Location, after: int, until: int
) -> list[Any] | None:
    """The days of the state rows that versions ``after+1..until`` changed, from the
    change data feed; None when the feed no longer covers them (then every day is
    recomputed: exact, only slower)."""
    try:
        changes = (
            spark.read.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", after + 1)
            .option("endingVersion", until)
            .load(state_path.spark_uri)
        )
        return [row[0] for row in changes.select(F.to_date("window_start")).distinct().collect()]
    except Exception as exc:  # versions vacuumed or the log dropped below them
        log.warning("the change feed of %s from %d is gone (%s): every day", state_path, after, exc)
        return None


def check_summarizable(pipeline: Pipeline, settings: Settings) -> Location:
    """The state table to summarize; refused before Spark starts when there is none."""
    app = pipeline.application_id
    if pipeline.window is None:
        raise ConfigError(f"{app} has no window: a daily summary needs window_start")
    state_path = AppLayout(settings.warehouse, app).table("state")
    if not RsDeltaTable.is_deltatable(str(state_path)):
        raise ConfigError(f"{app} has no state table at {state_path}: run the pipeline first")
    return state_path


def summarize(
    spark: SparkSession,
    pipeline: Pipeline,
    settings: Settings,
    echo: Callable[[str], None] = print,
) -> dict[str, Any]:
    app = pipeline.application_id
    state_path = check_summarizable(pipeline, settings)
    current = RsDeltaTable(str(state_path)).version()  # every read below is of this one
    target = summary_path(settings, pipeline)
    done = summarized_version(target, pipeline)
    if done is not None and done >= current:
        echo(f"daily summary of {app}: up to date with state version {current}")
        return {"state_version": current, "days": 0, "skipped": True}
    state = spark.read.format("delta").option("versionAsOf", current).load(state_path.spark_uri)
    days = None if done is None else touched_days(spark, state_path, done, current)
    if days is not None:
        state = state.where(F.to_date("window_start").isin(days))
    rows = daily_rows(pipeline, state, current)

    from delta.tables import DeltaTable

    # One writer at a time (Delta-spark's log stores are single-writer).
    with table_lock(target, f"summarize --pipeline {app}") as held:
        held.check()
        table = (
            DeltaTable.createIfNotExists(spark)
            .location(target.spark_uri)
            .addColumns(rows.schema)
            .execute()
        )
        gone = F.lit(True) if days is None else F.col("t.day").isin(days)
        merge = (
            table.alias("t")
            .merge(rows.alias("s"), "t.day = s.day")
            .whenMatchedUpdateAll()
            .whenNotMatchedInsertAll()
            .whenNotMatchedBySourceDelete(gone)  # a touched day with no state row left
        )
        # Delta's exactly-once marker of this MERGE (the pair is reset after each write):
        # also what refuses a summarizer woken after a newer one summarized a later
        # state version (Delta skips a version at or below the recorded one).
        held.check()
        spark.conf.set(TXN_APP_ID, txn_app_id(pipeline))
        spark.conf.set(TXN_VERSION, str(current))
        try:
            merge.execute()
        finally:
            spark.conf.unset(TXN_APP_ID)
            spark.conf.unset(TXN_VERSION)
    covered = summarized_version(target, pipeline)
    if covered is None or covered < current:
        raise ConsistencyError(f"the daily summary of {app} did not record state version {current}")
    count = "every day" if days is None else f"{len(days)} day(s)"
    echo(f"daily summary of {app}: {count} recomputed at state version {current} -> {target}")
    return {"state_version": current, "days": None if days is None else len(days)}
