"""The SparkSession every job uses: RocksDB state with changelog checkpointing,
Spark's Kafka source, Delta Lake (delta-spark) and the platform's own JVM sources
(the batch watermark, pinned Delta versions, a seeded epoch's seed and hold) on the
classpath, and the ``jobs`` package shipped to the executors so the same job runs
on ``local[N]`` and on any cluster manager."""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from pyspark.sql import SparkSession

from jobs import sql_settings
from jobs.errors import ConfigError
from jobs.jars import spark_jars
from jobs.package import package_zip
from jobs.settings import REPO_ROOT, Settings
from jobs.streaming import batch_clock
from jobs.streaming.jvm import Lifetime, driver_java_options, note_a_complete_run
from jobs.warehouse import S3A_CREDENTIALS, Location, aws_environment, s3a_settings

# Spark's own Kafka source (from the jars ``make setup`` resolved).
KAFKA_PROVIDER = "org.apache.spark.sql.kafka010.KafkaSourceProvider"
CLOCK_SOURCE = batch_clock.FORMAT
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
# Delta Lake's SQL extension and catalog: what ``format("delta")``, ``DeltaTable``
# and Delta's SQL need in every session (a user's session too: see docs/pipelines.md).
DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CONF = {
    "spark.sql.extensions": DELTA_EXTENSION,
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    # Partitions of a snapshot's log replay (default 50): the platform keeps its logs
    # small (maintain checkpoints them); 50 tasks cost ~1 s per table read on 2 cores.
    "spark.databricks.delta.snapshotPartitions": "2",
}
# Spark's checkpoint files (offsets, commits, state) written in place on a store that
# can abandon a write (S3A): one PUT instead of a temporary object, a copy and a
# delete; Spark's rename-based writes elsewhere (include/jvm/sources).
CHECKPOINT_FILES = {
    "spark.sql.streaming.checkpointFileManagerClass": (
        "platform.streaming.AbortableCheckpointFileManager"
    )
}
# Delta-spark's commits on S3 (a dimension, a daily summary): each log entry created
# put-if-absent by the store, not probed and then PUT (include/jvm/sources).
LOG_STORES = {
    f"spark.delta.logStore.{scheme}.impl": "platform.streaming.ConditionalS3LogStore"
    for scheme in ("s3a", "s3")
}
# What makes the store itself refuse a stale holder's write to a warehouse on S3
# (docs/architecture.md, the write map): a session the platform did not make
# (``hosted_by``) must have them too.
STORE_REFUSALS = {**LOG_STORES, **CHECKPOINT_FILES}
# How a query's RocksDB stores end (``query_settings``). Spark uploads a snapshot
# of a store only in a maintenance pass (every 60 s), which a query that stops after
# a batch or two never sees: it left changelog files only, and every later run
# replayed every one since the epoch began (2M rows: Spark 3.0 s -> 1.7 s a run).
UNLOAD_ON_COMMIT = "spark.sql.streaming.stateStore.unloadOnCommit"
SNAPSHOT_EVERY = "spark.sql.streaming.stateStore.minDeltasForSnapshot"
# Each task snapshots, uploads and closes its store / Spark's defaults: the stores stay
# loaded between batches and snapshot every 10 (each snapshot costs ~20 ms at commit).
# How long a query's stop() waits for the batch in flight (Spark's default: forever).
STOP_TIMEOUT_MS = 60_000
SHORT_QUERY_STATE = {UNLOAD_ON_COMMIT: "true", SNAPSHOT_EVERY: "1"}
LONG_QUERY_STATE = {UNLOAD_ON_COMMIT: "false", SNAPSHOT_EVERY: "10"}
# Spark runs a batch without records whenever the watermark moved, to drop the
# windows it closed from its state: every scheduled run ended with one (1.2 s of a
# warm 1M-event run). Each batch records the watermark it leaves instead
# (``observed.watermark_reached``); closed windows leave Spark's state in the next
# batch with records, which Spark runs with that watermark all the same.
NO_DATA_BATCHES = "spark.sql.streaming.noDataMicroBatches.enabled"
# Cluster Python default: a worker's interpreter is not at the driver's path.
CLUSTER_PYTHON = "python3"
# What the platform's tasks import on executors (checked on a cluster at start).
EXECUTOR_MODULES = (
    "jobs.streaming.changelog_files",
    "jobs.streaming.seed",
    "obstore",  # their staged files reach a warehouse on S3 through it
)
# Settings that hold a credential: never on a command line (``start_driver_jvm``).
CREDENTIAL_SETTINGS = frozenset(
    [f"spark.hadoop.{key}" for key in S3A_CREDENTIALS.values()]
    + [f"spark.executorEnv.{name}" for name in S3A_CREDENTIALS]
)
log = logging.getLogger(__name__)
# The session of the process that embeds the platform (``hosted_by``), if any,
# and the lock that runs its commands one at a time.
_host: SparkSession | None = None
_host_commands = threading.Lock()


def query_settings(spark: SparkSession, short: bool) -> None:
    """Set up the next query: only batches with records run, and its state stores
    end as it needs: a ``short`` query (available-now, the seed) leaves a snapshot of
    every store at each commit, so the next run loads it instead of replaying
    history; a continuous one keeps its stores loaded."""
    spark.conf.set(NO_DATA_BATCHES, "false")
    for key, value in (SHORT_QUERY_STATE if short else LONG_QUERY_STATE).items():
        spark.conf.set(key, value)


def executor_python(master: str, configured: str | None) -> str:
    """The Python executors run: the setting, else the driver's own for local
    masters (same machine, same packages), else ``python3`` on the worker's PATH."""
    if configured:
        return configured
    return sys.executable if master.startswith("local") else CLUSTER_PYTHON


def _submitted_master() -> str:
    """The ``--master`` spark-submit was given (it is in the JVM's properties)."""
    from pyspark import SparkConf

    return SparkConf().get("spark.master", "local[*]") or "local[*]"


def get_spark(
    master: str = "local[2]",
    app_name: str = "platform",
    driver_memory: str = "2g",
    python: str | None = None,
    lifetime: Lifetime = "long",
) -> SparkSession:
    """The shared session (Spark takes seconds to start: reuse it).

    ``python`` is the executors' interpreter (``PLATFORM_SPARK_PYTHON``); see
    ``executor_python`` for the default. ``lifetime``: how long the process lives
    (its JIT's options, ``jvm.jit_options``).
    """
    # Spark binds to a non-loopback address unless told otherwise.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ  # under spark-submit
    if submitted:
        master = _submitted_master()
    # Read by SparkContext when it starts: every Python worker, local or remote.
    os.environ["PYSPARK_PYTHON"] = executor_python(master, python)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # Python workers the driver's JVM starts (the source's planner) import ``jobs``
    # from the project; executors elsewhere get the zip below.
    paths = [str(REPO_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    archive = package_zip()
    jars = ",".join(str(jar) for jar in spark_jars())
    options: dict[str, str] = {}
    if not submitted:
        # Under spark-submit the driver's classpath is fixed already: --jars gives them.
        options["spark.master"] = master
        options["spark.jars"] = jars
        # Also on the driver's own class path: its JVM loads Delta's classes (used at
        # session start) from there, so the class-data-sharing archive holds them.
        options["spark.driver.extraClassPath"] = os.pathsep.join(str(j) for j in spark_jars())
    options |= {**DELTA_CONF, **CHECKPOINT_FILES, **LOG_STORES, **sql_settings.PINNED}
    options |= storage_conf(master)
    options |= {
        "spark.app.name": app_name,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        # Saves a state lookup per update (measured ~10%); only a metric needs it.
        "spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows": "false",
        # A query's stop() waits this long for its batch in flight, not forever: a
        # fenced stream must let go of the application even if a batch hangs.
        "spark.sql.streaming.stopTimeout": str(STOP_TIMEOUT_MS),
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.python.worker.reuse": "true",
        # On, PySpark records the Python call site of every DataFrame call in the JVM
        # (five round trips each): a third of the calls that build a query, 0.3 s of
        # each run. It names platform code only: users write no DataFrame code.
        "spark.python.sql.dataFrameDebugging.enabled": "false",
        "spark.driver.memory": driver_memory,
        "spark.driver.extraJavaOptions": driver_java_options(lifetime),
    }
    start_driver_jvm(options)
    builder = SparkSession.builder
    for key, value in options.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if submitted:
        check_jars(spark)
    ship_package(spark, archive)
    if not master.startswith("local"):
        check_executors(spark, os.environ["PYSPARK_PYTHON"])
    return spark


def start_driver_jvm(options: dict[str, str]) -> None:
    """Start the driver's JVM with every setting but the store's credentials.

    PySpark starts its JVM with ``spark-submit --conf k=v`` for each setting it has
    then, and any local user reads a process's arguments (``ps``). The credentials
    (``CREDENTIAL_SETTINGS``) reach the JVM when the session is made, over PySpark's
    authenticated gateway, and the executors over Spark's RPC. Does nothing when the
    JVM runs already (under ``spark-submit``, or a second session)."""
    from pyspark import SparkConf, SparkContext

    if SparkContext._gateway is not None:
        return
    launch = SparkConf(loadDefaults=False)
    for key, value in options.items():
        if key not in CREDENTIAL_SETTINGS:
            launch.set(key, value)
    SparkContext._ensure_initialized(conf=launch)


def storage_conf(master: str) -> dict[str, str]:
    """The object store as this process's AWS variables say: S3A's settings, and on
    a cluster the variables themselves for the executors (their Python tasks write
    staged files through ``jobs/warehouse.py``; the values stay out of Spark's UI,
    which redacts keys named like secrets)."""
    environ = aws_environment()
    found = {f"spark.hadoop.{key}": value for key, value in s3a_settings(environ).items()}
    if not master.startswith("local"):
        found.update({f"spark.executorEnv.{name}": value for name, value in environ.items()})
    return found


@contextmanager
def command_session(
    settings: Settings,
    app_name: str,
    *,
    runs_a_pipeline: bool = False,
    lifetime: Lifetime = "short",
) -> Iterator[SparkSession]:
    """The Spark session of one command (``run``, ``backfill``, ``verify``): a Spark
    of its own, stopped at the end (which closes the state stores before the JVM
    removes their files), or the host's session when the process embeds the
    platform (``hosted_by``). ``runs_a_pipeline``: a command that ends well has
    loaded what a run loads, so the JVM's archive may be kept (``jobs/streaming/jvm.py``).
    ``lifetime``: "long" for a command that runs until stopped (a continuous run)."""
    if _host is not None:
        # Before the command writes anything: the host's session was made without us.
        values = {key: _host.conf.get(key, None) for key in STORE_REFUSALS}
        check_store_settings(values, settings.warehouse)
        with _host_commands:
            yield _host
        return
    from pyspark import SparkContext

    if SparkContext._active_spark_context is not None:
        # getOrCreate would hand back that session, and the end of the command stop it.
        raise ConfigError(
            "this process runs a Spark session already: run the command under "
            "jobs.streaming.spark.hosted_by(spark), or in a process of its own"
        )
    spark = get_spark(
        settings.spark_master,
        app_name,
        settings.spark_driver_memory,
        settings.spark_python,
        lifetime,
    )
    try:
        yield spark
        if runs_a_pipeline:
            note_a_complete_run()
    finally:
        spark.stop()


@contextmanager
def hosted_by(spark: SparkSession) -> Iterator[None]:
    """Commands (``jobs.cli.main``) run in ``spark``, one at a time, and leave it
    running: how a process that has a session already (a notebook, the test suite)
    runs them without starting a second Spark. Its master and settings are the
    host's; ``PLATFORM_SPARK_*`` do not apply."""
    global _host
    check_delta_session(spark)
    check_jars(spark)
    previous, _host = _host, spark
    try:
        yield
    finally:
        _host = previous


def check_jars(spark: SparkSession) -> None:
    """A ``spark-submit`` (or a host's session) without the platform's jars fails
    here, with the fix."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    for what, name in (
        ("Spark's Kafka source", KAFKA_PROVIDER),
        ("Delta Lake", DELTA_EXTENSION),
        ("The platform's own JVM source", CLOCK_SOURCE),
    ):
        try:
            jvm.org.apache.spark.util.Utils.classForName(name, True, False)
        except Exception as err:  # py4j wraps the JVM's ClassNotFoundException
            raise ConfigError(
                f"{what} is not on the driver's classpath: pass the platform's jars, "
                'spark-submit --jars "$(python -m jobs jars | paste -sd,)" ...'
            ) from err


def check_delta_session(spark: SparkSession) -> None:
    """A session the platform did not make (``hosted_by``) must have Delta's extension
    and catalog: without them ``format("delta")`` fails deep in a command."""
    for key, value in DELTA_CONF.items():
        if key.startswith("spark.sql.") and value not in (spark.conf.get(key, "") or ""):
            raise ConfigError(
                f"this Spark session lacks {key}={value}: build it with the settings of "
                "jobs.streaming.spark.DELTA_CONF (docs/pipelines.md, Reading the tables from "
                "your own Spark)"
            )


def check_store_settings(values: Mapping[str, str | None], warehouse: Location) -> None:
    """A host's session (its settings ``values``) writing a warehouse on S3 must
    create Delta log entries and Spark's checkpoint files put-if-absent, as the
    platform's own sessions do: without that, a stale holder's writes (a loader or a
    stream woken after a takeover) are not refused by the store. A local disk needs
    neither (its holders are serialized by ``flock``)."""
    if not warehouse.is_s3:
        return
    lacking = [f"{k}={v}" for k, v in STORE_REFUSALS.items() if values.get(k) != v]
    if lacking:
        raise ConfigError(
            f"this Spark session lacks {', '.join(lacking)}, without which the store does "
            f"not refuse a stale holder's writes to the warehouse {warehouse}: build the "
            "session with them (jobs.streaming.spark.STORE_REFUSALS); nothing was written"
        )


def check_sql_settings(spark: SparkSession) -> dict[str, str]:
    """The pinned SQL settings of ``spark`` (``jobs/sql_settings.py``), or one
    ``ConfigError`` naming a setting that would make it compute otherwise."""
    values = {key: spark.conf.get(key) for key in sql_settings.PINNED}  # set, or Spark's default
    jvm = spark._jvm
    assert jvm is not None
    defaults = jvm.org.apache.spark.sql.internal.SQLConf()  # nothing set: Spark's defaults
    legacy = {}
    for key, value in spark.conf.getAll.items():
        if key.startswith(sql_settings.LEGACY) and key not in sql_settings.PINNED:
            try:
                default = str(defaults.getConfString(key))
            except Exception:  # py4j: a key Spark does not know has no default
                default = None
            if default is None or default.lower() != value.lower():
                legacy[key] = value
    sql_settings.check_session(values, legacy)
    return {key: str(value) for key, value in values.items()}


def check_executors(spark: SparkSession, python: str) -> None:
    """Before anything runs on a cluster: every executor's Python starts and imports
    what the platform's tasks import. Else the first batch would fail deep in a task
    with a worker traceback. One small job (a task per core)."""
    modules = EXECUTOR_MODULES

    def probe(_rows: Iterable[int]) -> Iterator[tuple[str, str, str]]:
        # Defined here so that it is pickled by value: it must run where ``jobs``
        # itself may not import.
        import importlib
        import sys

        for module in modules:
            try:
                importlib.import_module(module)
            except ImportError as exc:
                yield sys.executable, module, exc.name or str(exc)
                return
        yield sys.executable, "", ""

    context = spark.sparkContext
    tasks = max(1, context.defaultParallelism)
    fix = (
        "install the platform's requirements.txt in every worker's Python, or set "
        "PLATFORM_SPARK_PYTHON to one that has them"
    )
    try:
        answers = context.parallelize(range(tasks), tasks).mapPartitions(probe).collect()
    except Exception as err:  # py4j: the worker's Python did not start
        raise ConfigError(
            f"the Spark executors cannot run PLATFORM_SPARK_PYTHON={python!r} "
            f"({_first_reason(err)}): {fix}"
        ) from err
    for executable, module, missing in answers:
        if module:
            raise ConfigError(
                f"the Spark executors' Python ({executable}, PLATFORM_SPARK_PYTHON={python!r}) "
                f"has no module {missing!r}, which {module} needs: {fix}"
            )


def _first_reason(err: Exception) -> str:
    """The line of a failed job's error that says why (not the whole trace)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    for line in lines:
        if "Cannot run program" in line or "PYTHON_VERSION_MISMATCH" in line or "Error" in line:
            return line[:300]
    return lines[0][:300] if lines else type(err).__name__


def ship_package(spark: SparkSession, archive: Path) -> None:
    """Every task's Python worker imports ``jobs`` from this zip, on any cluster manager."""
    shipped = spark.sparkContext.getConf().get("spark.submit.pyFiles", "") or ""
    if archive.name in shipped or archive.name in (spark.sparkContext._python_includes or []):
        return
    spark.sparkContext.addPyFile(str(archive))
    log.info("shipping %s to executors", archive.name)
