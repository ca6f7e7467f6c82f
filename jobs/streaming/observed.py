"""Reading a micro-batch's observed input metrics from inside ``foreachBatch``.

``DataFrame.observe`` on a stream collects metrics during the batch's one scan,
but PySpark exposes them only in the progress event, after the batch has been
committed. The metrics are already complete when ``foreachBatch`` has run its
action, so we read them from the query's current execution (through py4j; Spark
4.2). ``batch.py`` runs exactly one action per batch, so they count each record
once.
"""

from __future__ import annotations

import json
from typing import Any

from pyspark.sql import SparkSession

from jobs.errors import ConsistencyError


def observed_metrics(spark: SparkSession, query_name: str, observation: str) -> dict[str, Any]:
    for query in spark.streams.active:
        if query.name == query_name:
            execution = query._jsq.streamingQuery().lastExecution()
            found = execution.observedMetrics().get(observation)
            if found.isDefined():
                result: dict[str, Any] = json.loads(found.get().json())
                return result
            raise ConsistencyError(f"batch metrics {observation!r} were not collected")
    raise ConsistencyError(f"no active streaming query named {query_name!r}")
