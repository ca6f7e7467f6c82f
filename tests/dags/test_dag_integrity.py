"""Every DAG imports cleanly, has tags, retries and an owner; forms validate."""

from __future__ import annotations

import dataclasses
import itertools
import re
import time
from pathlib import Path

import pytest
import yaml

from jobs.errors import ConfigError
from jobs.settings import REPO_ROOT, load_settings

DAGS = REPO_ROOT / "dags"


@pytest.fixture(scope="module")
def dagbag():  # type: ignore[no-untyped-def]
    from airflow.dag_processing.dagbag import DagBag

    started = time.perf_counter()
    bag = DagBag(dag_folder=str(DAGS))
    elapsed = time.perf_counter() - started
    # Reported, not asserted: parse time is a measurement, not a test.
    print(f"\nDagBag parsed {len(bag.dags)} DAGs from {DAGS} in {elapsed:.3f} s")
    return bag


def test_no_import_errors(dagbag) -> None:  # type: ignore[no-untyped-def]
    assert dagbag.import_errors == {}


def test_one_stream_dag_per_pipeline(dagbag) -> None:  # type: ignore[no-untyped-def]
    pipelines = {p.stem for p in (REPO_ROOT / "include" / "pipelines").glob("*.yaml")}
    assert {f"stream_{p}" for p in pipelines} <= set(dagbag.dag_ids)


def test_a_daily_drift_check_per_pipeline(dagbag) -> None:  # type: ignore[no-untyped-def]
    from datetime import timedelta

    from airflow.sdk.definitions.param import ParamsDict
    from airflow.sdk.exceptions import ParamValidationError

    for app in ("user_clicks", "inventory"):
        dag = dagbag.dags[f"verify_{app}"]
        assert dag.schedule == timedelta(days=1) or str(dag.timetable.summary).startswith("1 day")
        task = dag.get_task("verify")
        assert task.application_args[:3] == ["verify", "--pipeline", app]
        assert task.arguments_from_params({"sample": 0.25}) == ["--sample", "0.25"]
        for bad in (0, 1.5, "all"):
            params = ParamsDict(dag.params)
            with pytest.raises(ParamValidationError):
                params.update({"sample": bad})
                params.validate()


def test_every_dag_has_tags_retries_and_owner(dagbag) -> None:  # type: ignore[no-untyped-def]
    for dag_id, dag in dagbag.dags.items():
        assert dag.tags, f"{dag_id} has no tags"
        for task in dag.tasks:
            assert task.owner and task.owner != "airflow", f"{dag_id}.{task.task_id}: no owner"
            if dag_id.startswith("stream_"):
                assert task.retries >= 1, f"{dag_id}.{task.task_id} has no retries"


def test_stream_dag_shape(dagbag) -> None:  # type: ignore[no-untyped-def]
    dag = dagbag.dags.get("stream_user_clicks")
    assert dag.max_active_runs == 1
    assert dag.catchup is False
    run = dag.get_task("run")
    assert run.retry_exponential_backoff
    warehouse = load_settings().warehouse
    assert {o.uri for o in run.outlets} == {
        f"file://{warehouse}/user_clicks/state",
        f"file://{warehouse}/user_clicks/changelog",
    }
    assert run.application.endswith("jobs/__main__.py")
    assert run.application_args[:3] == ["run", "--pipeline", "user_clicks"]


def test_trigger_form_rejects_bad_values(dagbag) -> None:  # type: ignore[no-untyped-def]
    from airflow.sdk.definitions.param import ParamsDict
    from airflow.sdk.exceptions import ParamValidationError

    dag = dagbag.dags.get("stream_user_clicks")
    good = ParamsDict(dag.params)
    good.update({"trigger": "available-now", "reason": "catch up"})
    good.validate()
    for bad in ({"trigger": "sometimes"}, {"reason": "x" * 501}):
        params = ParamsDict(dag.params)
        with pytest.raises(ParamValidationError):
            params.update(bad)
            params.validate()


def test_continuous_pipeline_gets_a_supervised_stream_and_a_health_check(tmp_path: Path) -> None:
    import dataclasses

    from include.dag_factory import stream_dags

    data = yaml.safe_load((REPO_ROOT / "include" / "pipelines" / "user_clicks.yaml").read_text())
    data["application_id"] = "live_clicks"
    data["trigger"] = {"mode": "continuous", "interval": "30 seconds"}
    (tmp_path / "live_clicks.yaml").write_text(yaml.safe_dump(data))
    settings = dataclasses.replace(load_settings(), pipelines_dir=tmp_path)
    dags = stream_dags(settings)
    stream, health = dags["stream_live_clicks"], dags["health_live_clicks"]
    assert stream.schedule == "@continuous"
    assert stream.max_active_runs == 1
    task = stream.get_task("run")
    assert task.retries >= 10 and task.retry_exponential_backoff
    assert stream.params["trigger"] == "continuous"
    sensor = health.get_task("check")
    assert sensor.max_batch_age_s == 300 and sensor.mode == "reschedule"


def test_maintenance_dags_plan_approve_apply(dagbag) -> None:  # type: ignore[no-untyped-def]
    from airflow.providers.standard.operators.hitl import ApprovalOperator

    for name in ("rewind", "rebuild", "backfill"):
        dag = dagbag.dags[f"maintenance_{name}"]
        assert "dry_run" not in dag.params  # the approval replaced the second trigger
        assert set(dag.params.get_param("pipeline").schema["enum"]) >= {"user_clicks", "inventory"}
        tasks = ["plan", "describe_plan", "approval", "apply"]
        for upstream, downstream in itertools.pairwise(tasks):
            assert downstream in dag.get_task(upstream).downstream_task_ids
        assert isinstance(dag.get_task("approval"), ApprovalOperator)
    recovery = dagbag.dags["recovery"]
    assert {"check_user_clicks", "rebuild_user_clicks"} <= set(recovery.task_ids)


def test_the_approval_shows_the_plan_in_markdown() -> None:
    from include.maintenance_dags import plan_markdown
    from jobs.operations.saved_plans import SavedPlan
    from tests.unit.test_saved_plans import a_plan

    preview = {
        "keys_changed": 2,
        "keys_added": 0,
        "keys_removed": 1,
        "samples": [{"sku": "S1", "before": {"quantity": -3}, "after": {"quantity": 5}}],
        "differences": {"quantity": {"edges": [-2.0, 0.0, 4.0, 8.0], "counts": [1, 0, 4]}},
        "plot": "/warehouse/inventory/_backfill/preview-epoch0-1.png",
    }
    text = plan_markdown(
        SavedPlan(
            "20261123T101500Z-1a2b3c4d",
            a_plan(),
            None,
            "2026-11-23T10:15:00Z",
            "ana",
            {"preview": preview},
            "ab" * 32,
        )  # type: ignore[arg-type]
    )
    assert "| clicks[0] | 900 | 400 |" in text and "| clicks[1] | 850 | 420 |" in text
    assert f"checked when it is applied: `{'ab' * 32}`" in text
    assert "records to replay: **930**" in text
    assert "published state table: restore to version 7" in text
    assert "2 keys changed, 0 added, 1 removed" in text
    assert "| sku=S1 | {'quantity': -3} | {'quantity': 5} |" in text
    assert "Spread of quantity after - before over the changed keys, -2 to 8: `▂ █`" in text
    assert "/warehouse/inventory/\\_backfill/preview-epoch0-1.png" in text


def test_tables_are_maintained_on_a_schedule(dagbag) -> None:  # type: ignore[no-untyped-def]
    from datetime import timedelta

    dag = dagbag.dags["maintenance_tables"]
    assert dag.schedule == timedelta(hours=1) or str(dag.timetable.summary).startswith("1:00")
    for app in ("user_clicks", "inventory"):
        task = dag.get_task(f"maintain_{app}")
        assert task.application_args[:3] == ["maintain", "--pipeline", app]
        assert "--reason" in task.application_args and "--dry-run" not in task.application_args


def test_maintenance_forms_reject_bad_values(dagbag) -> None:  # type: ignore[no-untyped-def]
    from airflow.sdk.definitions.param import ParamsDict
    from airflow.sdk.exceptions import ParamValidationError

    dag = dagbag.dags["maintenance_rewind"]
    good = ParamsDict(dag.params)
    good.update({"reason": "replay the last hour", "target": "by-duration", "target_value": "PT1H"})
    good.validate()
    for bad in (
        {"reason": ""},  # a reason is required
        {"reason": "    "},  # and says something: the job would refuse it after the form
        {"reason": "ok reason", "target": "to-yesterday"},
        {"reason": "ok reason", "pipeline": "no_such_pipeline"},
        {"reason": "ok reason", "mode": "sideways"},
    ):
        params = ParamsDict(dag.params)
        with pytest.raises(ParamValidationError):
            params.update(bad)
            params.validate()


def test_operation_arguments_from_the_form() -> None:
    from include.maintenance_dags import backfill_args, rebuild_args, rewind_args

    base = {"reason": "why", "topics": "", "mode": "reprocess"}
    assert rewind_args({**base, "target": "to-latest", "target_value": ""}) == [
        "--to-latest",
        "--mode",
        "reprocess",
        "--reason",
        "why",
    ]
    assert rewind_args(
        {**base, "target": "by-duration", "target_value": "PT1H", "topics": "a"}
    ) == ["--by-duration", "PT1H", "--topics", "a", "--mode", "reprocess", "--reason", "why"]
    assert rebuild_args({"reason": "why", "from_source": True}) == [
        "--from-source",
        "--reason",
        "why",
    ]
    assert backfill_args({"reason": "why", "start": "from-offset", "start_value": "5"}) == [
        "--from-offset",
        "5",
        "--reason",
        "why",
    ]
    fixed = {"reason": "why", "start": "from-earliest", "start_value": "", "dimensions": "newest"}
    assert backfill_args(fixed) == ["--from-earliest", "--dimensions", "newest", "--reason", "why"]


def test_values_from_records_cannot_write_markdown_into_the_approval() -> None:
    from include.maintenance_dags import plan_markdown
    from jobs.operations.saved_plans import SavedPlan
    from tests.unit.test_saved_plans import a_plan

    hostile = "[click](http://evil.example) <img src=x onerror=alert(1)> a|b **x**\n# h"
    preview = {
        "keys_changed": 1,
        "keys_added": 0,
        "keys_removed": 0,
        "samples": [{"sku": hostile, "before": {"quantity": hostile}, "after": {"quantity": 1}}],
    }
    plan = dataclasses.replace(a_plan(), reason="fix <b>it</b> [now](x)")
    text = plan_markdown(
        SavedPlan(  # type: ignore[arg-type]
            "20261123T101500Z-1a2b3c4d", plan, None, "t", "`ana`", {"preview": preview}, "0" * 64
        )
    )
    row = next(line for line in text.splitlines() if "evil" in line)
    # One table row of three cells: no pipe, bracket, angle bracket, star or
    # newline of the value is left unescaped.
    assert len(re.findall(r"(?<!\\)\|", row)) == 4, row
    for special in "[]<>*`":
        assert not re.search(rf"(?<!\\){re.escape(special)}", row), (special, row)
    assert "\\[click\\](http://evil.example)" in row and "\\<img" in row
    assert "fix \\<b\\>it\\</b\\> \\[now\\](x)" in text and "\\`ana\\`" in text


def test_the_approval_names_its_approvers_when_the_deployment_sets_them(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from include.maintenance_dags import operation_dag, rebuild_args

    monkeypatch.setenv("PLATFORM_APPROVERS", "ana,li.wei")
    dag = operation_dag("rebuild", "Rebuild", {}, rebuild_args)
    approval = dag.get_task("approval")
    assert approval.assigned_users == [
        {"id": "ana", "name": "ana"},
        {"id": "li.wei", "name": "li.wei"},
    ]
    monkeypatch.setenv("PLATFORM_APPROVERS", "ana,<script>")
    with pytest.raises(ConfigError, match="PLATFORM_APPROVERS"):
        operation_dag("rebuild", "Rebuild", {}, rebuild_args)


def test_the_dimension_dag_publishes_the_table_the_enriched_stream_reads(dagbag) -> None:  # type: ignore[no-untyped-def]
    dimension = dagbag.dags["dimension_merchants"]
    load = dimension.get_task("load")
    assert load.application_args == ["dimension", "--dimension", "merchants"]
    (published,) = load.outlets
    assert published.name == "dims.merchants"
    assert published.uri.endswith("/dims/merchants")
    stream = dagbag.dags["stream_orders_by_category"]
    assert [a.name for a in stream.get_task("run").inlets] == ["dims.merchants"]
    assert "kept by DAG `dimension_merchants`" in (stream.doc_md or "")


def test_assets_of_paths_with_spaces_hash_and_unicode_are_distinct_uris() -> None:
    import dataclasses

    from include.dag_factory import dimension_asset

    settings = dataclasses.replace(load_settings(), warehouse=Path("/w/ware house 50% é"))
    first = dimension_asset(Path("/w/ware house 50% é/dims/m #1"), settings)
    second = dimension_asset(Path("/w/ware house 50% é/dims/m #2"), settings)
    # Airflow keeps a URI up to its '#': unescaped, the two tables were one Asset.
    assert first.uri != second.uri
    assert first.uri == "file:///w/ware%20house%2050%25%20%C3%A9/dims/m%20%231"
