"""A scheduled run leaves a snapshot of every RocksDB state store in the checkpoint,
so the next run loads it instead of replaying every changelog file since the epoch
began (Spark uploads snapshots only in a maintenance pass a short run never saw)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import jobs_args, pipeline_file, produce, recent_clicks, run_in_process
from tests.live import assert_exact_clicks

pytestmark = pytest.mark.integration


def store_versions(checkpoint_root: Path) -> dict[Path, tuple[int, set[int]]]:
    """Each state store folder: (its newest version, the versions with a snapshot)."""
    found = {}
    for store in sorted(checkpoint_root.glob("*/state/*/[0-9]*")):
        changelogs = {int(f.stem) for f in store.glob("*.changelog")}
        snapshots = {int(f.stem) for f in store.glob("*.zip")}
        found[store] = (max(changelogs | snapshots), snapshots)
    return found


def test_each_scheduled_run_leaves_a_snapshot_of_its_state(  # type: ignore[no-untyped-def]
    spark, broker, kafka_config, new_topic, tmp_path
) -> None:
    topic = new_topic(2)
    pipeline = pipeline_file(tmp_path, "user_clicks", topic)
    warehouse = tmp_path / "warehouse"
    run = jobs_args(pipeline, broker.bootstrap_servers, warehouse, "run", "--quiet")
    values: list[bytes] = []
    for salt in (1, 2):
        batch = recent_clicks(400, salt)
        produce(kafka_config, topic, batch)
        values += batch
        done = run_in_process(spark, [*run, "--trigger", "available-now"])
        assert done.returncode == 0, done.stderr[-3000:]
        stores = store_versions(warehouse / "user_clicks" / "_checkpoints")
        assert stores, "no state store in the checkpoint"
        for store, (newest, snapshots) in stores.items():
            assert newest in snapshots, f"{store}: version {newest} has no snapshot"
    assert_exact_clicks(warehouse, values)
