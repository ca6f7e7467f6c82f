"""Airflow DAGs for the maintenance operations, and the scheduled recovery check.

``maintenance_rewind``, ``maintenance_rebuild``, ``maintenance_backfill``: a trigger
form (pipeline chosen from the defined ones, the operation's options, a required
reason); ``plan`` saves the exact plan under this run's id, ``approval`` (Airflow's
human-in-the-loop ``ApprovalOperator``) shows it in Markdown and writes a
rejection into the ledger, and ``apply`` applies exactly that plan once approved.
``recovery`` checks every application's status every 15 minutes and rebuilds one whose Spark
checkpoint is damaged. The jobs' per-application lock keeps all of them apart from
each other and from the streams (an operation fences a running stream).
``maintenance_tables`` runs ``maintain`` for every application every hour: it
compacts and vacuums next to the streams, keeping every rewind target inside each
pipeline's ``maintenance.rewind_horizon``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.providers.standard.operators.python import PythonOperator, ShortCircuitOperator
from airflow.sdk import DAG, Param

from include.dag_factory import START, default_args
from jobs.pipeline.parser import load_each_pipeline
from jobs.settings import load_settings
from platform_airflow.hooks import PlatformHook
from platform_airflow.operators import PlanApprovalOperator, PlatformJobOperator, run_plan_id

if TYPE_CHECKING:
    from jobs.operations.saved_plans import SavedPlan

REWIND_TARGETS = ["to-earliest", "to-latest", "to-offset", "to-datetime", "by-duration", "shift-by"]
BACKFILL_STARTS = ["from-earliest", "from-datetime", "from-offset"]
# The XCom the plan's digest goes to apply in (shown for approval, checked at apply).
PLAN_DIGEST = "plan_digest"


def _reason(params: dict[str, Any]) -> list[str]:
    return ["--reason", str(params["reason"])]


def rewind_args(params: dict[str, Any]) -> list[str]:
    args = [f"--{params['target']}"]
    if params["target"] not in ("to-earliest", "to-latest"):
        args.append(str(params["target_value"]))
    if params.get("topics"):
        args += ["--topics", str(params["topics"])]
    return [*args, "--mode", str(params["mode"]), *_reason(params)]


def rebuild_args(params: dict[str, Any]) -> list[str]:
    return [*(["--from-source"] if params["from_source"] else []), *_reason(params)]


def backfill_args(params: dict[str, Any]) -> list[str]:
    args = [f"--{params['start']}"]
    if params["start"] != "from-earliest":
        args.append(str(params["start_value"]))
    if params.get("dimensions", "recorded") != "recorded":
        args += ["--dimensions", str(params["dimensions"])]
    return [*args, *_reason(params)]


# What Markdown (and the HTML it may carry) would read as markup in a line or cell.
MARKUP = re.compile(r"([\\`*_\[\]<>|!#~])")


def md(value: object) -> str:
    """``value`` as literal text in the approval's Markdown: a key or a reason from
    outside (a record's field, a form) can add no link, image, HTML or table cell."""
    return MARKUP.sub(r"\\\1", " ".join(str(value).split()))


def plan_markdown(saved_plan: SavedPlan) -> str:
    """The approval's body: what applying will do, in numbers."""
    plan = saved_plan.plan
    lines = [
        f"**{plan.operation} of `{plan.application_id}`**: {md(plan.reason)}",
        "",
        f"Plan `{saved_plan.plan_id}`, made {md(saved_plan.created_at)} by "
        f"{md(saved_plan.created_by)}; epoch {plan.epoch_before} -> {plan.epoch_after}. "
        f"Digest (SHA-256), checked when it is applied: `{saved_plan.digest}`.",
        "",
        "| partition | current | target |",
        "|---|---:|---:|",
    ]
    for tp in sorted(set(plan.current_offsets) | set(plan.target_offsets)):
        now, then = plan.current_offsets.get(tp, "-"), plan.target_offsets.get(tp, "-")
        lines.append(f"| {tp[0]}[{tp[1]}] | {now} | {then} |")
    action = plan.state_action.value
    if plan.restore_version is not None:
        action += f" to version {plan.restore_version}"
    lines += [
        "",
        f"- records to replay: **{plan.records_to_replay}**",
        f"- records skipped: **{plan.records_skipped}**",
        f"- published state table: {action}",
    ]
    lines += [f"- {md(note)}" for note in plan.notes]
    preview = saved_plan.extra.get("preview")
    if preview:
        lines += [
            "",
            f"**Corrections**: {preview['keys_changed']} keys changed, {preview['keys_added']} "
            f"added, {preview['keys_removed']} removed.",
            "",
            "| key | before | after |",
            "|---|---|---|",
        ]
        for sample in preview.get("samples", []):
            key = ", ".join(f"{k}={v}" for k, v in sample.items() if k not in ("before", "after"))
            lines.append(f"| {md(key)} | {md(sample['before'])} | {md(sample['after'])} |")
        for name, hist in (preview.get("differences") or {}).items():
            lines += [
                "",
                f"Spread of {name} after - before over the changed keys, "
                f"{hist['edges'][0]:g} to {hist['edges'][-1]:g}: `{sparkline(hist['counts'])}`",
            ]
        if preview.get("plot"):
            lines += [
                "",
                f"Plot of the corrections (top keys, spread of the differences): "
                f"{md(preview['plot'])}",
            ]
    return "\n".join(lines)


def sparkline(counts: list[int]) -> str:
    """A histogram as one line of block characters (the approval's body is text)."""
    blocks = " ▁▂▃▄▅▆▇█"
    top = max(counts, default=0) or 1
    return "".join(blocks[-(-count * 8 // top)] for count in counts)


def describe_plan(**context: Any) -> str:
    from jobs.delta.layout import AppLayout
    from jobs.operations import saved_plans

    settings = load_settings()
    app = context["params"]["pipeline"]
    layout = AppLayout(settings.warehouse, app)
    operation = context["dag"].dag_id.removeprefix("maintenance_")
    saved = saved_plans.load(layout, run_plan_id(context), operation)
    # What the person approves is what ``apply`` applies: it is given this digest.
    context["ti"].xcom_push(key=PLAN_DIGEST, value=saved.digest)
    return plan_markdown(saved)


def operation_dag(
    name: str,
    description: str,
    params: dict[str, Param],
    build_args: Callable[[dict[str, Any]], list[str]],
    dry_flag: str = "--dry-run",
) -> DAG:
    # Broken definitions are left out of the form (the stream DAGs show their errors).
    loaded, _broken = load_each_pipeline(load_settings().pipelines_dir)
    pipelines = sorted(p.application_id for p in loaded) or ["(no valid pipeline)"]
    with DAG(
        dag_id=f"maintenance_{name}",
        description=description,
        doc_md=f"{description}. One run: `plan` saves the exact plan, `approval` shows it "
        "(offsets per partition, records affected, a backfill's top changed keys) and waits "
        "for a person; Approve applies exactly that plan, Reject applies nothing and the "
        "ledger records it.",
        schedule=None,
        start_date=START,
        catchup=False,
        max_active_runs=1,
        tags=["maintenance", name],
        default_args=default_args(retries=1),
        params={
            "pipeline": Param(pipelines[0], enum=pipelines, description="the application"),
            **params,
            "reason": Param(
                type="string",
                minLength=3,
                maxLength=500,
                pattern=r"\S",  # not only spaces: the job refuses those (check_reason)
                description="why (goes into the ledger)",
            ),
        },
    ) as dag:
        plan = PlatformJobOperator(
            task_id="plan",
            command=name,
            pipeline="{{ params.pipeline }}",
            arguments_from_params=lambda p: [*build_args(p), dry_flag],
            arguments_from_context=lambda context: ["--save-plan", run_plan_id(context)],
        )
        describe = PythonOperator(task_id="describe_plan", python_callable=describe_plan)
        approval = PlanApprovalOperator(
            task_id="approval",
            operation=name,
            pipeline="{{ params.pipeline }}",
            subject=f"Apply this {name} of {{{{ params.pipeline }}}}?",
            body="{{ ti.xcom_pull(task_ids='describe_plan') }}",
            assigned_users=[{"id": u, "name": u} for u in load_settings().approvers] or None,
            retries=0,
        )
        apply = PlatformJobOperator(
            task_id="apply",
            command=name,
            pipeline="{{ params.pipeline }}",
            arguments_from_context=lambda context: [
                "--plan",
                run_plan_id(context),
                "--plan-digest",
                str(context["ti"].xcom_pull(task_ids="describe_plan", key=PLAN_DIGEST)),
                "--reason",
                str(context["params"]["reason"]),
            ],
        )
        plan >> describe >> approval >> apply
    return dag


def needs_rebuild(application_id: str) -> bool:
    status = PlatformHook().status(application_id)
    return bool(status.get("repair") == "rebuild")


def recovery_dag() -> DAG:
    with DAG(
        dag_id="recovery",
        description="Rebuilds applications whose Spark checkpoint is damaged",
        doc_md="Every 15 minutes: `status` of every application; a damaged checkpoint "
        "(missing, unreadable, empty state store behind a non-empty ledger) gets a rebuild "
        "from Delta.",
        schedule=timedelta(minutes=15),
        start_date=START,
        catchup=False,
        max_active_runs=1,
        tags=["maintenance", "recovery"],
        default_args=default_args(retries=1),
    ) as dag:
        for pipeline in load_each_pipeline(load_settings().pipelines_dir)[0]:
            app = pipeline.application_id
            check = ShortCircuitOperator(
                task_id=f"check_{app}", python_callable=needs_rebuild, op_args=[app]
            )
            rebuild = PlatformJobOperator(
                task_id=f"rebuild_{app}",
                command="rebuild",
                pipeline=app,
                arguments=["--reason", "automatic recovery: damaged Spark checkpoint"],
            )
            check >> rebuild
    return dag


MAINTAIN_EVERY = timedelta(hours=1)


def maintenance_tables_dag() -> DAG:
    with DAG(
        dag_id="maintenance_tables",
        description="Compacts, vacuums and checkpoints every application's tables",
        doc_md="Every hour, `maintain` per application: small files compacted, the Delta log "
        "checkpointed, old files vacuumed except those of state versions a rewind may still "
        "target (the pipeline's `maintenance.rewind_horizon`), old epochs' Spark checkpoints "
        "and staged files of batches that can no longer commit deleted. Runs next to the "
        "streams; skipped while an operation holds the application (the next run catches up).",
        schedule=MAINTAIN_EVERY,
        start_date=START,
        catchup=False,
        max_active_runs=1,
        tags=["maintenance", "tables"],
        default_args=default_args(retries=1),
    ) as dag:
        for pipeline in load_each_pipeline(load_settings().pipelines_dir)[0]:
            PlatformJobOperator(
                task_id=f"maintain_{pipeline.application_id}",
                command="maintain",
                pipeline=pipeline.application_id,
                arguments=["--reason", "scheduled maintenance (maintenance_tables DAG)"],
            )
    return dag


def maintenance_dags() -> dict[str, DAG]:
    dags = [
        operation_dag(
            "rewind",
            "Rewind an application's input (reprocess: state goes back; skip: input jumps)",
            {
                "target": Param("to-latest", enum=REWIND_TARGETS, description="where to"),
                "target_value": Param(
                    "", type="string", description="offset spec, ISO time, PnDTnHnMnS or N"
                ),
                "topics": Param("", type="string", description="comma list; empty: all"),
                "mode": Param("reprocess", enum=["reprocess", "skip"]),
            },
            rewind_args,
        ),
        operation_dag(
            "rebuild",
            "Rebuild Spark's state from the Delta state table (or from the source)",
            {"from_source": Param(False, type="boolean", description="recompute from Kafka")},
            rebuild_args,
        ),
        operation_dag(
            "backfill",
            "Recompute with the current pipeline version and publish the corrections",
            {
                "start": Param("from-earliest", enum=BACKFILL_STARTS),
                "start_value": Param("", type="string", description="ISO time or offset spec"),
                "dimensions": Param(
                    "recorded",
                    enum=["recorded", "newest"],
                    description="enrichment tables: the versions the batches joined, or the "
                    "newest (after a fix of a table)",
                ),
            },
            backfill_args,
            dry_flag="--preview",
        ),
        recovery_dag(),
        maintenance_tables_dag(),
    ]
    return {dag.dag_id: dag for dag in dags}
