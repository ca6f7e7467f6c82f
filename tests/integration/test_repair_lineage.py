"""Repairs after repairs (issue 20): a second rewind never restores a state the
first discarded, and a backfill leaves every record it did not read to the stream,
which judges it (dead letters) and records it. Inventory v1 subtracts returns, v2
adds them back; expected values are plain-Python sums."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from deltalake import DeltaTable

from jobs.pipeline.parser import load_pipeline
from jobs.settings import REPO_ROOT
from jobs.streaming.run import run_pipeline
from tests.conftest import produce, run_jobs
from tests.integration.test_backfill import expected, movements, signed_qty, state

pytestmark = pytest.mark.integration


def inventory_file(tmp_path: Path, topic: str, version: int, **source: Any) -> Path:
    data = yaml.safe_load((REPO_ROOT / "include" / "pipelines" / "inventory.yaml").read_text())
    data["source"].update({"topics": [topic], **source})
    data["version"] = version
    data["derived"][0]["expr"] = signed_qty(version)
    directory = tmp_path / f"v{version}"
    directory.mkdir()
    path = directory / "inventory.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def encoded(events: list[dict[str, Any]]) -> list[bytes]:
    return [json.dumps(e).encode() for e in events]


def test_a_second_rewind_never_restores_what_the_first_discarded(  # type: ignore[no-untyped-def]
    spark, settings, kafka_config, new_topic, tmp_path
) -> None:
    topic = new_topic(1)
    v1 = inventory_file(tmp_path, topic, 1, max_offsets_per_trigger=100)
    v2 = inventory_file(tmp_path, topic, 2)
    events = movements(400, 1)
    produce(kafka_config, topic, encoded(events))
    run_pipeline(spark, load_pipeline(str(v1), tmp_path), settings)  # ends 100, 200, 300, 400

    def rewind(offset: int, reason: str) -> None:
        target = json.dumps({topic: {"0": offset}})
        done = run_jobs(
            v2, settings, "rewind", "--to-offset", target, "--reason", reason, spark=spark
        )
        assert done.returncode == 0, done.stderr[-2000:]
        run_pipeline(spark, load_pipeline(str(v2), tmp_path), settings)

    # v2 replays from 100 in one batch: v1's batches ending at 200 and 300 are gone.
    rewind(100, "deploy v2 from offset 100")
    mixed = Counter(expected(events[:100], 1))
    mixed.update(expected(events[100:], 2))
    assert state(settings.warehouse) == dict(mixed)
    # A second rewind to 250: the last live boundary at or before it is offset 100
    # (v1's state there), never v1's discarded boundary at 200.
    rewind(250, "again")
    assert state(settings.warehouse) == dict(mixed)


def test_records_after_the_last_batch_are_left_to_the_stream_by_a_backfill(  # type: ignore[no-untyped-def]
    spark, settings, kafka_config, new_topic, tmp_path
) -> None:
    topic = new_topic(1)
    v1, v2 = inventory_file(tmp_path, topic, 1), inventory_file(tmp_path, topic, 2)
    first = movements(300, 2)
    produce(kafka_config, topic, encoded(first))
    run_pipeline(spark, load_pipeline(str(v1), tmp_path), settings)
    # Produced after the stream's last batch: good records and three bad ones.
    later = movements(50, 3)
    bad = [b"not json", b'{"sku": "S1"}', json.dumps({**later[0], "qty": "many"}).encode()]
    produce(kafka_config, topic, encoded(later) + bad)
    reason = ["--reason", "returns were subtracted"]
    done = run_jobs(v2, settings, "backfill", "--from-earliest", *reason, spark=spark)
    assert done.returncode == 0, done.stderr[-2000:]
    assert state(settings.warehouse) == expected(first, 2)  # what the stream had judged
    run_pipeline(spark, load_pipeline(str(v2), tmp_path), settings)
    assert state(settings.warehouse) == expected(first + later, 2)
    # Every bad record is a dead letter, once; every record is accounted for.
    app = Path(settings.warehouse) / "inventory"
    letters = DeltaTable(str(app / "dead_letter")).to_pyarrow_table().to_pylist()
    assert sorted(r["offset"] for r in letters) == [350, 351, 352]
    ledger = DeltaTable(str(app / "_ledger")).to_pyarrow_table().to_pylist()
    batches = [r for r in ledger if r["entry_type"] == "batch"]
    assert sum(r["records_in"] for r in batches) == len(first) + len(later) + len(bad)
    assert sum(r["dead_lettered"] for r in batches) == len(bad)
    # Verify, twice: the same decisions each time, no drift.
    for _ in range(2):
        checked = run_jobs(v2, settings, "verify", spark=spark)
        assert checked.returncode == 0, checked.stdout[-2000:] + checked.stderr[-2000:]
        assert ", 0 differ" in checked.stdout
