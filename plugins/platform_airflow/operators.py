"""Submitting ``python -m jobs ...`` through Spark: the same command a user runs by
hand with ``spark-submit`` on a worker. An available-now ``run`` goes first to the
warm driver (``jobs/warm_driver.py``; ``PLATFORM_DRIVER_URL``, else one on this
machine's ``PLATFORM_DRIVER_PORT``), with no JVM started for it; when none takes
it, the task says why in its log and uses spark-submit. A malformed
``PLATFORM_DRIVER_URL`` (like any bad ``PLATFORM_*`` value) is no reason to fall
back: the task fails with the one line ``load_settings`` gives."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.providers.standard.operators.hitl import ApprovalOperator

from jobs.jars import spark_jars
from jobs.package import package_zip
from jobs.pipeline.parser import load_pipeline
from jobs.settings import REPO_ROOT, Settings, load_settings, platform_environment
from jobs.streaming.jvm import driver_java_options
from platform_airflow.hooks import storage_environment, use_storage_connection

ENTRY_POINT = str(REPO_ROOT / "jobs" / "__main__.py")


def run_plan_id(context: Any) -> str:
    """The id a maintenance DAG run's plan is saved as: the same in every task of
    the run (its run id and time), in the form ``jobs/operations/saved_plans.py`` takes."""
    from jobs.operations.saved_plans import new_id  # Delta and Arrow: not at parse time

    dag_run = context["dag_run"]
    moment = getattr(dag_run, "run_after", None) or getattr(dag_run, "logical_date", None)
    return new_id(str(dag_run.run_id), moment.timestamp() if moment is not None else 0.0)


class PlatformJobOperator(SparkSubmitOperator):
    """``spark-submit jobs/__main__.py <command> --pipeline <pipeline> <arguments>``
    (without ``pipeline``: ``<command> <arguments>``, e.g. ``dimension``).

    ``arguments`` are templated (trigger-form params reach the command line). The
    worker's PLATFORM_* environment is handed to the job when it runs.
    """

    def __init__(
        self,
        *,
        command: str,
        pipeline: str | None = None,
        arguments: list[str] | None = None,
        arguments_from_params: Callable[[dict[str, Any]], list[str]] | None = None,
        arguments_from_context: Callable[[dict[str, Any]], list[str]] | None = None,
        **kwargs: Any,
    ) -> None:
        settings = load_settings()
        kwargs.setdefault("conn_id", settings.spark_conn_id)
        kwargs.setdefault("name", "-".join(p for p in (command, pipeline) if p))
        kwargs.setdefault("driver_memory", settings.spark_driver_memory)
        target = ["--pipeline", pipeline] if pipeline is not None else []
        super().__init__(
            application=ENTRY_POINT,
            application_args=[command, *target, *(arguments or [])],
            **kwargs,
        )
        # Arguments that depend on trigger-form params (optional flags) or on the run
        # (a plan id), built at run time.
        self.arguments_from_params = arguments_from_params
        self.arguments_from_context = arguments_from_context

    def execute(self, context: Any) -> Any:
        if self.arguments_from_params is not None:
            self.application_args = [
                *(self.application_args or []),
                *self.arguments_from_params(dict(context["params"])),
            ]
        if self.arguments_from_context is not None:
            self.application_args = [
                *(self.application_args or []),
                *self.arguments_from_context(context),
            ]
        settings = load_settings()
        url = self.warm_driver_url(settings)
        if url is not None:
            from jobs.warm_driver import NoWarmDriver

            try:
                return self._run_on_warm_driver(settings, url)
            except NoWarmDriver as exc:
                self.log.warning("not on a warm driver, with spark-submit instead: %s", exc)
        dag_run = context.get("dag_run")
        user = getattr(dag_run, "triggering_user_name", None) or "scheduler"
        self.env_vars = {
            **platform_environment(),
            **storage_environment(settings),
            "PLATFORM_TRIGGERED_BY": user,
            # Decided here: the job runs in the process spark-submit starts.
            "PLATFORM_DRIVER_URL": "",
            **(self.env_vars or {}),
        }
        # spark-submit starts the driver's JVM, so its options are given here: the
        # same log config and class-data-sharing archive a local run uses.
        self.conf = {"spark.driver.extraJavaOptions": driver_java_options(), **(self.conf or {})}
        # The package goes with the job: in cluster deploy mode the driver itself runs
        # on a worker (in client mode the job would add the same zip itself).
        self.py_files = self.py_files or str(package_zip())
        # The jars every Spark session of the platform adds (Spark's Kafka source).
        self.jars = self.jars or ",".join(str(jar) for jar in spark_jars())
        return super().execute(context)

    def warm_driver_url(self, settings: Settings) -> str | None:
        """Where this task goes first: a ``run`` whose trigger is available-now goes
        to the warm driver (``Settings.scheduled_driver_url``); anything else, and
        a run no warm driver takes, goes to spark-submit."""
        args = list(self.application_args or [])
        url = settings.scheduled_driver_url
        if url is None or args[:2] != ["run", "--pipeline"]:
            return None
        if "--trigger" in args:
            trigger = str(args[args.index("--trigger") + 1])
        else:
            trigger = str(load_pipeline(args[2], settings.pipelines_dir).trigger_mode)
        return url if trigger == "available-now" else None

    def _run_on_warm_driver(self, settings: Settings, url: str) -> dict[str, Any]:
        from jobs.warm_driver import run_remote

        pipeline = load_pipeline(list(self.application_args or [])[2], settings.pipelines_dir)
        summary = run_remote(settings, pipeline, url)
        committed = [b for b in summary.batches if not b.skipped]
        self.log.info(
            "%s: %d batches committed, %d records, epoch %d, %.1f s on the warm driver %s",
            summary.application_id,
            len(committed),
            summary.records_in,
            summary.epoch,
            summary.seconds,
            url,
        )
        return {"batches": len(committed), "records_in": summary.records_in}


class PlanApprovalOperator(ApprovalOperator):
    """A person approves or rejects the run's saved plan (Airflow's human-in-the-loop
    approval; the plan is its Markdown body). Approve: the downstream ``apply``
    applies exactly that plan. Reject: nothing is applied (``apply`` is skipped),
    and the rejection, by whom, goes into the application's ledger."""

    template_fields = (*ApprovalOperator.template_fields, "pipeline")

    def __init__(self, *, operation: str, pipeline: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.operation = operation
        self.pipeline = pipeline

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        # Recorded before the base class answers: a rejection ends in an exception
        # that skips the downstream tasks (no code runs after it).
        if "error" not in event and self.REJECT in list(event.get("chosen_options") or []):
            from jobs.delta.layout import AppLayout
            from jobs.operations.saved_plans import record_rejection

            settings = load_settings()
            use_storage_connection(settings)
            pipeline = load_pipeline(self.pipeline, settings.pipelines_dir)
            user = event.get("responded_by_user") or {}
            by = str(user.get("name") or user.get("id") or "unknown")
            plan_id = run_plan_id(context)
            layout = AppLayout(settings.warehouse, pipeline.application_id)
            record_rejection(layout, pipeline, plan_id, self.operation, by)
            self.log.info("plan %s rejected by %s: recorded in the ledger", plan_id, by)
        return super().execute_complete(context=context, event=event)
