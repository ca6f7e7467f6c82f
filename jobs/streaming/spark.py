"""The SparkSession every job uses: local by default, RocksDB state with changelog
checkpointing, and the ``kafka`` Python data source registered."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from jobs.kafka_source.datasource import KafkaDataSource
from jobs.settings import REPO_ROOT
from jobs.streaming.seed import SeedDataSource

LOG4J_CONFIG = REPO_ROOT / "include" / "config" / "log4j2.properties"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def get_spark(
    master: str = "local[2]", app_name: str = "platform", driver_memory: str = "2g"
) -> SparkSession:
    """The shared session (Spark takes seconds to start: reuse it)."""
    # Spark binds to a non-loopback address unless told otherwise; Python workers
    # must run this interpreter, which has the project's packages.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # Python workers unpickle the source and import ``jobs``: put the project on
    # their path (spark-submit on a cluster ships it with --py-files instead).
    paths = [str(REPO_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    builder = SparkSession.builder
    # Under spark-submit the master comes from its --master; otherwise from settings.
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        builder = builder.master(master)
    spark = (
        builder.appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB_PROVIDER)
        .config(
            "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled",
            "true",
        )
        # Saves a state lookup per update (measured ~10%); only a metric needs it.
        .config("spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.python.worker.reuse", "true")
        .config("spark.driver.memory", driver_memory)
        .config("spark.driver.extraJavaOptions", f"-Dlog4j.configurationFile={LOG4J_CONFIG}")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(KafkaDataSource)
    spark.dataSource.register(SeedDataSource)
    return spark
