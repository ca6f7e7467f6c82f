"""One broken pipeline file degrades only its own DAG: every other DAG still loads."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from jobs.settings import REPO_ROOT

DAGS = REPO_ROOT / "dags"


def test_a_broken_pipeline_file_shows_on_its_own_dag_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.dag_processing.dagbag import DagBag

    for name in ("user_clicks", "inventory"):
        shutil.copy(REPO_ROOT / "include" / "pipelines" / f"{name}.yaml", tmp_path)
    (tmp_path / "orders.yaml").write_text("application_id: orders\nkeys: [[a]]\n")
    (tmp_path / "garbled.yaml").write_text("a: [")
    monkeypatch.setenv("PLATFORM_PIPELINES_DIR", str(tmp_path))

    bag = DagBag(dag_folder=str(DAGS))
    assert bag.import_errors == {}
    assert {
        "stream_user_clicks",
        "stream_inventory",
        "maintenance_rewind",
        "maintenance_rebuild",
        "maintenance_backfill",
        "maintenance_tables",
        "recovery",
    } <= set(bag.dag_ids)
    for stem, fragment in (("orders", "source: is required"), ("garbled", "not valid YAML")):
        broken = bag.dags[f"stream_{stem}"]
        assert "broken" in broken.tags
        assert fragment in broken.description and fragment in broken.doc_md
        assert broken.task_ids == ["invalid_definition"]
    form = bag.dags["maintenance_rewind"].params.get_param("pipeline").schema["enum"]
    assert set(form) == {"user_clicks", "inventory"}


def test_a_broken_dimension_file_shows_on_its_own_dag_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.dag_processing.dagbag import DagBag

    shutil.copy(REPO_ROOT / "include" / "dimensions" / "merchants.yaml", tmp_path)
    (tmp_path / "stores.yaml").write_text("name: stores\nsource: /x.jsonl\nkey: id\n")
    monkeypatch.setenv("PLATFORM_DIMENSIONS_DIR", str(tmp_path))

    bag = DagBag(dag_folder=str(DAGS))
    assert bag.import_errors == {}
    assert "dimension_merchants" in bag.dag_ids
    broken = bag.dags["dimension_stores"]
    assert "broken" in broken.tags and "columns: is required" in broken.description
    assert broken.task_ids == ["invalid_definition"]
