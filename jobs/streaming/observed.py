"""Reading what a micro-batch observed, from inside ``foreachBatch``.

``DataFrame.observe`` on a stream collects metrics during the batch's one scan,
but PySpark exposes them only in the progress event, after the batch has been
committed. The metrics are already complete when ``foreachBatch`` has run its
action, so we read them from the query's current execution (through py4j; Spark
4.2). ``batch.py`` runs exactly one action per batch, so they count each record
once. The event times the batch's watermark operator saw are there too: the
watermark the batch leaves behind is known before its commit.
"""

from __future__ import annotations

import json
from typing import Any

from pyspark.sql import SparkSession

from jobs.errors import ConsistencyError


def _execution(spark: SparkSession, query_name: str) -> Any:
    """The running batch's ``IncrementalExecution`` (the query's last one)."""
    for query in spark.streams.active:
        if query.name == query_name:
            return query._jsq.streamingQuery().lastExecution()
    raise ConsistencyError(f"no active streaming query named {query_name!r}")


def observed_metrics(spark: SparkSession, query_name: str, observation: str) -> dict[str, Any]:
    found = _execution(spark, query_name).observedMetrics().get(observation)
    if found.isDefined():
        result: dict[str, Any] = json.loads(found.get().json())
        return result
    raise ConsistencyError(f"batch metrics {observation!r} were not collected")


def watermark_reached(spark: SparkSession, query_name: str, watermark_ms: int) -> int:
    """The watermark Spark moves on to after the running batch, whose own is
    ``watermark_ms``: Spark's ``WatermarkTracker`` applied to the batch's execution,
    as Spark applies it once the batch has committed (the newest event time the
    watermark operator saw, minus its delay; a watermark never goes back). Spark
    writes it to the checkpoint's commit log; the ledger records it in the same
    commit as the batch, so that a cut never needs a batch without records to learn
    it. The platform's queries have one watermark operator, for which a new tracker
    decides as the query's own does."""
    execution = _execution(spark, query_name)
    jvm = spark._jvm
    assert jvm is not None
    tracker = jvm.org.apache.spark.sql.execution.streaming.runtime.WatermarkTracker.apply(
        spark._jsparkSession.conf(), execution.logical()
    )
    tracker.setWatermark(watermark_ms)
    tracker.updateWatermark(execution.executedPlan())
    return int(tracker.currentWatermark())
