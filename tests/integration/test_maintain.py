"""``maintain``: tables compacted and vacuumed, old epochs' folders deleted, and
every boundary inside the rewind horizon still a working rewind target."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from deltalake import DeltaTable

from jobs.pipeline.parser import load_pipeline
from jobs.settings import Settings
from jobs.streaming.run import run_pipeline
from tests.conftest import continuous_pipeline, pipeline_file, produce, run_jobs, start_stream
from tests.conftest import recent_clicks as clicks
from tests.expected import clicks_per_window, state_as_counter

pytestmark = pytest.mark.integration


def with_maintenance(path: Path, **settings: Any) -> Path:
    data = yaml.safe_load(path.read_text())
    data["maintenance"] = settings
    path.write_text(yaml.safe_dump(data))
    return path


def rows(settings: Settings, name: str) -> list[dict[str, Any]]:
    path = Path(settings.warehouse) / "user_clicks" / name
    return DeltaTable(str(path)).to_pyarrow_table().to_pylist()


def boundaries(settings: Settings) -> list[dict[str, Any]]:
    batches = [r for r in rows(settings, "_ledger") if r["entry_type"] == "batch"]
    found = [r for r in batches if json.loads(r["delta_versions"]).get("state_after") is not None]
    return sorted(found, key=lambda r: (r["epoch"], r["batch_id"]))


def assert_exact(settings: Settings, values: list[bytes]) -> None:
    expected, _dead, late = clicks_per_window([values])
    assert late == 0
    assert state_as_counter(rows(settings, "state"), "clicks") == expected


def test_a_rewind_to_the_oldest_kept_boundary_works_after_maintain(  # type: ignore[no-untyped-def]
    spark, settings, kafka_config, new_topic, tmp_path
) -> None:
    topic = new_topic(2)
    path = pipeline_file(tmp_path, "user_clicks", topic, max_offsets_per_trigger=400)
    first, second = clicks(1200, 0), clicks(800, 3)
    produce(kafka_config, topic, first)
    run_pipeline(spark, load_pipeline(str(path), tmp_path), settings)
    run_one = boundaries(settings)
    time.sleep(2)
    produce(kafka_config, topic, second)
    run_pipeline(spark, load_pipeline(str(path), tmp_path), settings)
    assert len(boundaries(settings)) > len(run_one) >= 3

    # The horizon reaches just past run one's last boundary: it is the oldest kept.
    last_of_run_one = run_one[-1]
    kept_version = json.loads(last_of_run_one["delta_versions"])["state_after"]
    # Its age on the store's clock, which maintain judges by: when the store (a
    # local disk here) received its state version's log entry.
    entry = Path(settings.warehouse / "user_clicks" / "state" / "_delta_log")
    age = time.time() - (entry / f"{kept_version:020d}.json").stat().st_mtime
    with_maintenance(path, rewind_horizon=f"{int(age)} seconds", reader_grace_hours=0)
    state_dir = Path(settings.warehouse / "user_clicks" / "state")
    on_disk_before = len(list(state_dir.glob("*.parquet")))
    # The changelog as an older platform made it: Delta's log defaults.
    changelog = str(settings.warehouse / "user_clicks" / "changelog")
    older = {"delta.checkpointInterval": "100", "delta.enableExpiredLogCleanup": "true"}
    DeltaTable(changelog).alter.set_table_properties(older)
    done = run_jobs(path, settings, "maintain", "--reason", "test", spark=spark)
    assert done.returncode == 0, done.stderr
    configured = DeltaTable(changelog).metadata().configuration
    assert configured["delta.checkpointInterval"] == "10"  # loads read at most 10 entries
    assert configured["delta.enableExpiredLogCleanup"] == "false"
    started = [
        json.loads(r["details"])
        for r in rows(settings, "_ledger")
        if r["entry_type"] == "maintain" and json.loads(r["details"]).get("phase") == "started"
    ]
    assert started[-1]["kept_boundary"] == {
        "epoch": last_of_run_one["epoch"],
        "batch_id": last_of_run_one["batch_id"],
    }
    assert len(list(state_dir.glob("*.parquet"))) < on_disk_before
    # The log is cut at the kept boundary's state version, which stays loadable
    # from its new checkpoint (the rewind below loads it); the other tables' logs
    # are cut at their version when maintain began.

    def first_entry(table: str) -> int:
        log = Path(settings.warehouse / "user_clicks" / table / "_delta_log")
        return min(int(p.name[:20]) for p in log.glob("*.json"))

    assert first_entry("state") == kept_version > 0
    assert (state_dir / "_delta_log" / f"{kept_version:020d}.checkpoint.parquet").exists()
    assert first_entry("changelog") > len(run_one)
    # The first boundary's state is gone: rewinding there is refused, not half-done.
    oldest_version = json.loads(run_one[0]["delta_versions"])["state_after"]
    with pytest.raises(Exception):  # noqa: B017 - delta-rs reports a missing file
        DeltaTable(str(state_dir), version=oldest_version).to_pyarrow_table()
    too_old = json.loads(run_one[0]["end_offsets"])
    refused = run_jobs(
        path, settings, "rewind", "--to-offset", json.dumps(too_old), "--reason", "t", spark=spark
    )
    assert refused.returncode == 2 and "rewind horizon" in refused.stderr, refused.stderr

    kept = last_of_run_one["end_offsets"]
    rewound = run_jobs(
        path, settings, "rewind", "--to-offset", kept, "--reason", "test", spark=spark
    )
    assert rewound.returncode == 0, rewound.stderr
    assert "'restored_version'" in rewound.stdout
    run_pipeline(spark, load_pipeline(str(path), tmp_path), settings)
    assert_exact(settings, first + second)

    # Epoch 0's checkpoint is no longer needed once epoch 1 runs: the next maintain
    # deletes it; the state stays exact and status finds nothing wrong.
    checkpoint_zero = Path(settings.warehouse) / "user_clicks" / "_checkpoints" / "epoch=0"
    assert checkpoint_zero.exists()
    again = run_jobs(path, settings, "maintain", "--reason", "test", spark=spark)
    assert again.returncode == 0, again.stderr
    assert not checkpoint_zero.exists()
    assert_exact(settings, first + second)
    status = run_jobs(path, settings, "status", "--json", spark=spark)
    assert json.loads(status.stdout)["problems"] == []


def test_maintain_next_to_a_running_stream(  # type: ignore[no-untyped-def]
    spark, settings, kafka_config, new_topic, tmp_path
) -> None:
    topic = new_topic(2)
    path = continuous_pipeline(tmp_path, "user_clicks", topic, max_offsets_per_trigger=300)
    data = yaml.safe_load(path.read_text())
    produced = clicks(600, 0)
    produce(kafka_config, topic, produced)
    stream = start_stream(path, settings)
    try:
        deadline = time.monotonic() + 120
        while not (settings.warehouse / "user_clicks" / "_ledger").exists() or not boundaries(
            settings
        ):
            assert time.monotonic() < deadline and stream.poll() is None, "the stream never began"
            time.sleep(0.5)
        # Grace 0 would let vacuum delete files the stream is writing: refused.
        zero = tmp_path / "zero" / "user_clicks.yaml"
        zero.parent.mkdir()
        zero.write_text(path.read_text())
        with_maintenance(zero, reader_grace_hours=0)
        refused = run_jobs(zero, settings, "maintain", "--reason", "test", spark=spark)
        assert refused.returncode == 2 and "reader_grace_hours" in refused.stderr
        for round_ in range(3):
            more = clicks(300, round_ + 1)
            produce(kafka_config, topic, more)
            produced += more
            done = run_jobs(path, settings, "maintain", "--reason", f"round {round_}", spark=spark)
            assert done.returncode == 0, done.stderr
    finally:
        stream.send_signal(signal.SIGTERM)
        _out, err = stream.communicate(timeout=120)
    assert stream.returncode == 0, err[-3000:]
    data["trigger"] = {"mode": "available-now"}
    path.write_text(yaml.safe_dump(data))
    run_pipeline(spark, load_pipeline(str(path), tmp_path), settings)
    assert_exact(settings, produced)
    batches = [
        (r["epoch"], r["batch_id"]) for r in rows(settings, "_ledger") if r["batch_id"] is not None
    ]
    assert len(batches) == len(set(batches))
    maintained = [r for r in rows(settings, "_ledger") if r["entry_type"] == "maintain"]
    assert sum(json.loads(r["details"]).get("phase") == "done" for r in maintained) == 3
