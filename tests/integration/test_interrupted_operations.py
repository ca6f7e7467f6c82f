"""Operations are atomic from the user's side, and no table runs ahead of the ledger:
an operation that died after its fence, batches fenced or crashed between two
commits, at-least-once replays, partitions added while the application is down."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions
from deltalake import DeltaTable

from jobs.delta.layout import AppLayout
from jobs.delta.writer import table_epoch
from jobs.errors import ConsistencyError, SourceError
from jobs.ledger import current_epoch
from jobs.operations.restart import plan_rebuild, plan_rewind
from jobs.operations.runner import dry_run_operation, run_operation
from jobs.operations.targets import TargetSpec
from jobs.pipeline.parser import load_pipeline
from jobs.settings import Settings
from jobs.status import application_status
from tests.conftest import run_with_fault
from tests.expected import clicks_per_window, state_as_counter

pytestmark = pytest.mark.integration


def rows(settings: Settings, app: str, name: str) -> list[dict[str, Any]]:
    return DeltaTable(str(settings.warehouse / app / name)).to_pyarrow_table().to_pylist()


def clicks(n: int, salt: int) -> list[bytes]:
    now = int(time.time())
    return [
        json.dumps({"user_id": f"u{(i + salt) % 11}", "timestamp": now - 200 + i % 150}).encode()
        for i in range(n)
    ]


def run_job(path: Path, settings: Settings, fault: str | None, spark: Any = None) -> int:
    return run_with_fault(path, settings.bootstrap_servers, settings.warehouse, fault, spark=spark)


def test_an_operation_that_died_after_its_fence_is_refused_then_completed(
    settings, clicks_app, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    # Batches end at 300, 600, 900: the rewind restores to 600.
    app = clicks_app(1, max_offsets_per_trigger=300)
    pipeline = app.pipeline
    first = app.feed(clicks(900, 1))

    # The rewind dies after it fenced the application, before its state action.
    def broken_restore(*_args: Any, **_kwargs: Any) -> None:
        raise OSError("disk went away")

    spec = TargetSpec("shift", "-100")
    monkeypatch.setattr(DeltaTable, "restore", broken_restore)
    with pytest.raises(OSError):
        run_operation(
            pipeline,
            settings,
            lambda: plan_rewind(pipeline, settings, "fix", spec, "reprocess", None),
            echo=lambda _line: None,
        )
    monkeypatch.undo()

    with pytest.raises(ConsistencyError, match=r"rewind by .* did not finish; run the same rewind"):
        app.run()
    assert any("unfinished operation" in p for p in application_status(pipeline, settings).problems)

    run_operation(
        pipeline,
        settings,
        lambda: plan_rewind(pipeline, settings, "fix again", spec, "reprocess", None),
        echo=lambda _line: None,
    )
    second = app.feed(clicks(100, 2))
    expected, _dead, _late = clicks_per_window([first + second])
    assert state_as_counter(rows(settings, "user_clicks", "state"), "clicks") == expected
    assert application_status(pipeline, settings).problems == []


@pytest.mark.parametrize("guarantee", ["exactly_once", "at_least_once"])
def test_a_batch_cut_off_after_its_state_commit_leaves_nothing_ahead_of_the_ledger(
    spark, settings, clicks_app, tmp_path, guarantee
) -> None:  # type: ignore[no-untyped-def]
    """A crash between the state merge and the ledger row, then a rebuild (instead of
    a replay): the rebuild takes the state back to the ledger's last batch."""
    app = clicks_app(2, max_offsets_per_trigger=300, archive=True)
    data = yaml_with(app.path, processing_guarantee=guarantee)
    pipeline = load_pipeline(str(data), tmp_path)
    values = clicks(900, 3)
    app.produce(values)
    assert run_job(data, settings, "after_state@1") == -9
    state_batches = {r["batch_id"] for r in rows(settings, "user_clicks", "state")}
    assert 1 in state_batches  # the orphan merge is there

    run_operation(
        pipeline,
        settings,
        lambda: plan_rebuild(pipeline, settings, "lost checkpoint", False),
        echo=lambda _line: None,
    )
    layout = AppLayout(settings.warehouse, "user_clicks")
    epoch = current_epoch(layout)
    for name in ("state", "changelog", "dead_letter", "raw", "_ledger"):
        table = DeltaTable(str(layout.table(name)))
        assert table_epoch(table, "user_clicks") == epoch, name  # raw is fenced too
    ledger_batches = {
        (r["epoch"], r["batch_id"])
        for r in rows(settings, "user_clicks", "_ledger")
        if r["entry_type"] == "batch"
    }
    for name in ("changelog", "raw", "state"):
        left = {(r["epoch"], r["batch_id"]) for r in rows(settings, "user_clicks", name)}
        assert left - ledger_batches - {(epoch, -1)} == set(), name

    assert run_job(data, settings, None, spark) == 0
    expected, _dead, _late = clicks_per_window([values])
    assert state_as_counter(rows(settings, "user_clicks", "state"), "clicks") == expected
    ledger = [r for r in rows(settings, "user_clicks", "_ledger") if r["entry_type"] == "batch"]
    assert sum(r["records_in"] for r in ledger) == len(values)
    raw = rows(settings, "user_clicks", "raw")
    assert len({(r["partition"], r["offset"]) for r in raw}) == len(values) == len(raw)


def test_at_least_once_replays_after_crashes(spark, settings, clicks_app, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Killed after batch 1's state merge (replayed: the merge again, the total
    unchanged), then after batch 2's ledger row (skipped on the replay)."""
    app = clicks_app(2, max_offsets_per_trigger=300)
    data = yaml_with(app.path, processing_guarantee="at_least_once")
    values = clicks(900, 4)
    app.produce(values)
    for fault in ("after_state@1", "after_ledger@2"):
        assert run_job(data, settings, fault) == -9, fault
    assert run_job(data, settings, None, spark) == 0
    expected, _dead, _late = clicks_per_window([values])
    assert state_as_counter(rows(settings, "user_clicks", "state"), "clicks") == expected
    ledger = [r for r in rows(settings, "user_clicks", "_ledger") if r["entry_type"] == "batch"]
    batches = [(r["epoch"], r["batch_id"]) for r in ledger]
    assert len(batches) == len(set(batches)), "a batch is in the ledger twice"
    assert sum(r["records_in"] for r in ledger) == len(values)


def test_partitions_added_while_down_start_at_their_earliest_offset(
    settings, clicks_app, kafka_config, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    app = clicks_app(2)
    topic, pipeline = app.topic, app.pipeline
    first = app.feed(clicks(200, 5))
    # A rebuild writes a cut naming the two partitions; then the topic grows.
    run_operation(
        pipeline,
        settings,
        lambda: plan_rebuild(pipeline, settings, "move host", False),
        echo=lambda _line: None,
    )
    admin = AdminClient(kafka_config)
    for future in admin.create_partitions([NewPartitions(topic, 4)]).values():
        future.result()
    time.sleep(1)
    second = app.feed(clicks(200, 6))
    expected, _dead, _late = clicks_per_window([first + second])
    assert state_as_counter(rows(settings, "user_clicks", "state"), "clicks") == expected


def test_rebuild_from_source_refuses_when_retention_deleted_what_was_read(
    settings, clicks_app, kafka_config, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    app = clicks_app(1)
    topic, pipeline = app.topic, app.pipeline
    app.feed(clicks(100, 7))
    admin = AdminClient(kafka_config)
    for future in admin.delete_records([TopicPartition(topic, 0, 40)]).values():
        future.result()
    with pytest.raises(SourceError, match=r"no longer on the broker"):
        dry_run_operation(
            pipeline,
            settings,
            lambda: plan_rebuild(pipeline, settings, "recompute", True),
            echo=lambda _line: None,
        )


def yaml_with(path: Path, **changes: Any) -> Path:
    import yaml

    data = yaml.safe_load(path.read_text())
    data.update(changes)
    path.write_text(yaml.safe_dump(data))
    return path
