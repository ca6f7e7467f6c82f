"""One small factory that turns ``include/pipelines/*.yaml`` into Airflow DAGs.

Per pipeline ``stream_<application_id>``:

* ``available-now`` pipelines: a scheduled incremental run every
  ``schedule_minutes``, one run at a time, retries with exponential backoff;
* ``continuous`` pipelines: one long-running streaming task, supervised by the
  scheduler (``@continuous`` starts the next run as soon as one ends, retries back
  off), plus ``health_<application_id>``, which fails loudly when the last
  committed batch is too old or the application reports problems;
* ``verify_<application_id>``: every day, the drift check (``jobs/operations/verify.py``)
  on a sample of the keys;
* ``daily_summary_<application_id>`` (windowed pipelines), scheduled on the
  ``<application_id>_state`` Asset: a downstream Spark batch job (``jobs/daily_summary.py``).

Per dimension in ``include/dimensions`` ``dimension_<name>``: the batch job that
keeps the table pipelines enrich from (``jobs/dimension_load.py``), publishing it as the
``dims.<name>`` Asset; a stream DAG that enriches from it names it as an inlet.

The ``state`` and ``changelog`` tables are Assets (outlets), so downstream DAGs
can be scheduled on them. Nothing heavy is imported here: DAG files parse fast.
"""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn

from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG, Asset, Param

from jobs.dimension_load import Dimension, load_each_dimension
from jobs.errors import ConfigError
from jobs.pipeline.model import DIMENSIONS_DIR, Pipeline
from jobs.pipeline.parser import load_each_pipeline
from jobs.settings import Settings, load_settings
from jobs.warehouse import Location
from platform_airflow.operators import PlatformJobOperator
from platform_airflow.sensors import ApplicationHealthSensor

log = logging.getLogger(__name__)
OWNER = "data-platform"
START = datetime(2026, 1, 1, tzinfo=UTC)


def default_args(retries: int = 3) -> dict[str, Any]:
    return {
        "owner": OWNER,
        "retries": retries,
        "retry_delay": timedelta(seconds=30),
        "retry_exponential_backoff": True,
        "max_retry_delay": timedelta(minutes=10),
    }


def table_assets(pipeline: Pipeline, settings: Settings) -> list[Asset]:
    root = settings.warehouse / pipeline.application_id
    return [
        Asset(name=f"{pipeline.application_id}_{table}", uri=(root / table).as_uri())
        for table in ("state", "changelog")
    ]


def dimension_asset(table: Location, settings: Settings) -> Asset:
    """A Delta table pipelines enrich from: ``dims.<name>`` for the warehouse's
    ``dims/<name>`` (what ``dimension_<name>`` keeps), else named by its path. (No
    application's Asset has a '.' in its name.)"""
    kept = settings.warehouse / DIMENSIONS_DIR
    name = f"{DIMENSIONS_DIR}.{table.name}" if table.parent == kept else f"table:{table}"
    # A URI, escaped: Airflow would cut a path's '#' off as a fragment.
    return Asset(name=name, uri=table.as_uri())


def enrichment_doc(pipeline: Pipeline, settings: Settings) -> tuple[str, list[Asset]]:
    """What a stream DAG says about the tables it reads, and their Assets."""
    assets, lines = [], []
    for e in pipeline.enrich:
        table = Location.parse(e.path(settings.warehouse), f"enrich {e.name}'s table")
        asset = dimension_asset(table, settings)
        assets.append(asset)
        kept = asset.name.startswith(DIMENSIONS_DIR + ".")
        keeper = f", kept by DAG `dimension_{asset.name.split('.', 1)[1]}`" if kept else ""
        lines.append(
            f"- `{e.name}`: `{table}` (Asset `{asset.name}`"
            f"{keeper}), joined on `{e.record_key} = {e.name}.{e.table_key}`; each batch "
            "joins one version and records it"
        )
    doc = "\n\nEnriches each record from:\n\n" + "\n".join(lines) if lines else ""
    return doc, assets


def stream_dag(pipeline: Pipeline, settings: Settings) -> DAG:
    app = pipeline.application_id
    continuous = pipeline.trigger_mode == "continuous"
    enrichment, dimension_tables = enrichment_doc(pipeline, settings)
    doc = (
        f"Streams `{app}` (pipeline v{pipeline.version}): {pipeline.description}\n\n"
        f"Topics {', '.join(pipeline.topics)} -> `{settings.warehouse / app}`. "
        + (
            "Runs continuously; the scheduler restarts it with backoff when it dies."
            if continuous
            else f"Processes what is available every {pipeline.schedule_minutes} minutes."
        )
        + enrichment
    )
    with DAG(
        dag_id=f"stream_{app}",
        description=f"Kafka -> Delta streaming aggregation for {app}",
        doc_md=doc,
        schedule="@continuous" if continuous else timedelta(minutes=pipeline.schedule_minutes),
        start_date=START,
        catchup=False,
        max_active_runs=1,
        tags=["streaming", app],
        default_args=default_args(retries=100 if continuous else 3),
        params={
            "trigger": Param(
                pipeline.trigger_mode,
                enum=["continuous"] if continuous else ["available-now"],
                description="how the run ends: available-now stops when caught up",
            ),
            "reason": Param(
                None,
                type=["null", "string"],
                maxLength=500,
                description="optional note, kept with the run (its conf), not passed to the job",
            ),
        },
    ) as dag:
        PlatformJobOperator(
            task_id="run",
            command="run",
            pipeline=app,
            arguments=["--trigger", "{{ params.trigger }}", "--quiet"],
            inlets=dimension_tables,
            outlets=table_assets(pipeline, settings),
            execution_timeout=None if continuous else timedelta(hours=2),
        )
    return dag


def health_dag(pipeline: Pipeline) -> DAG:
    app = pipeline.application_id
    max_age = max(3 * pipeline.trigger_interval_seconds, 300)
    with DAG(
        dag_id=f"health_{app}",
        description=f"Fails loudly when {app} is stuck",
        doc_md=f"Checks the ledger of `{app}`: the last batch must be under {max_age} s old "
        "and `status` must see no problems.",
        schedule=timedelta(minutes=5),
        start_date=START,
        catchup=False,
        max_active_runs=1,
        tags=["health", app],
        default_args=default_args(retries=0),
    ) as dag:
        ApplicationHealthSensor(
            task_id="check",
            pipeline=app,
            max_batch_age_s=max_age,
            mode="reschedule",
            poke_interval=30,
            timeout=240,
        )
    return dag


VERIFY_EVERY = timedelta(days=1)
VERIFY_SAMPLE = 0.1


def verify_dag(pipeline: Pipeline) -> DAG:
    """The drift check: a batch recomputation of (a sample of) the state, compared
    with the published table; the task fails when keys differ."""
    app = pipeline.application_id
    with DAG(
        dag_id=f"verify_{app}",
        description=f"Recomputes {app}'s state in batch and compares it with the published one",
        doc_md=f"`python -m jobs verify --pipeline {app} --sample F`: the state's lineage "
        "(from the ledger) recomputed with the current pipeline version, compared with the "
        "`state` table. The result goes into the ledger; differing keys fail the task, with "
        "examples in its log.",
        schedule=VERIFY_EVERY,
        start_date=START,
        catchup=False,
        max_active_runs=1,
        tags=["verify", app],
        default_args=default_args(retries=1),
        params={
            "sample": Param(
                VERIFY_SAMPLE,
                type="number",
                exclusiveMinimum=0,
                maximum=1,
                description="the fraction of keys compared (1: all)",
            )
        },
    ) as dag:
        PlatformJobOperator(
            task_id="verify",
            command="verify",
            pipeline=app,
            arguments_from_params=lambda p: ["--sample", str(p["sample"])],
        )
    return dag


def daily_summary_dag(pipeline: Pipeline, settings: Settings) -> DAG:
    """The batch half's worked example: each time the stream updates ``state``, a
    Spark batch job brings ``<app>_daily`` up to date from the state's change data
    feed, exactly once (``jobs/daily_summary.py``)."""
    app = pipeline.application_id
    state = table_assets(pipeline, settings)[0]
    with DAG(
        dag_id=f"daily_summary_{app}",
        description=f"Daily summary of {app}'s state, incrementally (Spark, Delta CDF)",
        doc_md=f"`python -m jobs summarize --pipeline {app}`: the days the state's change "
        f"data feed touched since the last run, recomputed from `{app}/state` and merged "
        f"into `{app}_daily` with Delta's own exactly-once marker (txnAppId "
        f"`{app}/daily_summary`, txnVersion = the state version). Scheduled on the "
        f"`{state.name}` Asset.",
        schedule=[state],
        start_date=START,
        catchup=False,
        max_active_runs=1,
        tags=["batch", "downstream", app],
        default_args=default_args(retries=2),
    ) as dag:
        PlatformJobOperator(
            task_id="summarize",
            command="summarize",
            pipeline=app,
            execution_timeout=timedelta(hours=1),
        )
    return dag


def dimension_dag(dimension: Dimension, settings: Settings) -> DAG:
    """The batch half that feeds the streams: the file of a dimension loaded into
    its Delta table (a new version only when rows changed), published as an Asset."""
    table = dimension.table(settings.warehouse)
    minutes = dimension.schedule_minutes
    with DAG(
        dag_id=f"dimension_{dimension.name}",
        description=f"Keeps the {dimension.name} dimension table (Spark batch job -> Delta)",
        doc_md=f"`python -m jobs dimension --dimension {dimension.name}`: "
        f"{dimension.description} Reads `{dimension.source}` (JSON lines; key "
        f"`{dimension.key}`), checks it (every line parses, one row per key, no column "
        f"changes type) and commits it to `{table}` when its rows changed. Streams that "
        "enrich from it join one version per batch and record it; after a fix, "
        "`backfill --dimensions newest` republishes what the fix changes.",
        schedule=None if minutes is None else timedelta(minutes=minutes),
        start_date=START,
        catchup=False,
        max_active_runs=1,
        tags=["batch", "dimension", dimension.name],
        default_args=default_args(retries=2),
    ) as dag:
        PlatformJobOperator(
            task_id="load",
            command="dimension",
            arguments=["--dimension", dimension.name],
            outlets=[dimension_asset(table, settings)],
            execution_timeout=timedelta(hours=1),
        )
    return dag


def dimension_dags(settings: Settings | None = None) -> dict[str, DAG]:
    settings = settings or load_settings()
    if not settings.dimensions_dir.is_dir():
        return {}
    dimensions, broken = load_each_dimension(settings.dimensions_dir)
    dags = {f"dimension_{d.name}": dimension_dag(d, settings) for d in dimensions}
    for stem, error in broken.items():
        log.error("dimension %s does not load: %s", stem, error)
        dag = broken_definition_dag("dimension", stem, error)
        dags.setdefault(dag.dag_id, dag)
    return dags


def _fail_with(message: str) -> NoReturn:
    raise ConfigError(message)


def broken_definition_dag(kind: str, stem: str, error: ConfigError) -> DAG:
    """Stands in for the DAG of a pipeline (``kind`` stream) or dimension file that
    does not load: the error shows on this DAG (its description, docs and its one
    task's failure) instead of taking every DAG of the file down as an import error."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", stem)
    what = "pipeline" if kind == "stream" else kind
    with DAG(
        dag_id=f"{kind}_{name}",
        description=f"BROKEN {what} definition: {error}"[:1000],
        doc_md=f"**The {what} file `{stem}.yaml` does not load.** Fix it and the "
        f"DAG comes back on the next parse.\n\n```\n{error}\n```",
        schedule=None,
        start_date=START,
        catchup=False,
        tags=["streaming" if kind == "stream" else "batch", "broken", name],
        default_args=default_args(retries=1),
    ) as dag:
        PythonOperator(
            task_id="invalid_definition", python_callable=_fail_with, op_args=[str(error)]
        )
    return dag


def stream_dags(settings: Settings | None = None) -> dict[str, DAG]:
    settings = settings or load_settings()
    dags: dict[str, DAG] = {}
    pipelines, broken = load_each_pipeline(settings.pipelines_dir)
    for pipeline in pipelines:
        dags[f"stream_{pipeline.application_id}"] = stream_dag(pipeline, settings)
        dags[f"verify_{pipeline.application_id}"] = verify_dag(pipeline)
        if pipeline.window is not None:
            dags[f"daily_summary_{pipeline.application_id}"] = daily_summary_dag(pipeline, settings)
        if pipeline.trigger_mode == "continuous":
            dags[f"health_{pipeline.application_id}"] = health_dag(pipeline)
    for stem, error in broken.items():
        log.error("pipeline %s does not load: %s", stem, error)
        dag = broken_definition_dag("stream", stem, error)
        dags.setdefault(dag.dag_id, dag)
    return dags
