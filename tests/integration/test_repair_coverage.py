"""What the state covers, through repairs in any order (issue 28): a partition added
mid-epoch enters at its first offset, a skipped range stays out of every later
repair, and a version number names one definition. Inventory v1 subtracts
returns, v2 adds them back; expected values are plain-Python sums."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka.admin import AdminClient, NewPartitions
from deltalake import DeltaTable

from jobs import kafka_admin
from jobs.pipeline.parser import load_pipeline
from jobs.streaming.run import run_pipeline
from tests.conftest import run_jobs
from tests.integration.test_backfill import expected, movements, state
from tests.integration.test_repair_lineage import encoded, inventory_file

pytestmark = pytest.mark.integration


def produce_keyed(config: dict[str, str], topic: str, events: list[dict[str, Any]]) -> None:
    """Each event keyed by its position: spread over every partition of the topic."""
    now_ms = int(time.time() * 1000)
    records = ((str(i).encode(), v, now_ms) for i, v in enumerate(encoded(events)))
    kafka_admin.produce_all(config, topic, records)


def ok(done: Any) -> str:
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return str(done.stdout)


def batches(warehouse: Path) -> list[dict[str, Any]]:
    rows = DeltaTable(str(warehouse / "inventory" / "_ledger")).to_pyarrow_table().to_pylist()
    found = [r for r in rows if r["entry_type"] == "batch"]
    return sorted(found, key=lambda r: (r["epoch"], r["batch_id"]))


def offsets_of(row: dict[str, Any], column: str) -> dict[int, int]:
    return {int(p): o for t in json.loads(row[column]).values() for p, o in t.items()}


def test_a_partition_added_mid_epoch_is_read_from_its_first_offset_by_every_repair(  # type: ignore[no-untyped-def]
    spark, settings, kafka_config, new_topic, tmp_path
) -> None:
    topic = new_topic(2)
    v1, v2 = inventory_file(tmp_path, topic, 1), inventory_file(tmp_path, topic, 2)
    first, second = movements(300, 1), movements(300, 2)
    produce_keyed(kafka_config, topic, first)
    run_pipeline(spark, load_pipeline(str(v1), tmp_path), settings)
    admin = AdminClient(kafka_config)
    for future in admin.create_partitions([NewPartitions(topic, 4)]).values():
        future.result()
    time.sleep(1)
    produce_keyed(kafka_config, topic, second)
    run_pipeline(spark, load_pipeline(str(v1), tmp_path), settings)  # no operation between
    assert state(settings.warehouse) == expected(first + second, 1)
    last = batches(settings.warehouse)[-1]
    assert sorted(offsets_of(last, "start_offsets")) == [0, 1, 2, 3]
    assert offsets_of(last, "start_offsets")[2] == 0 and offsets_of(last, "start_offsets")[3] == 0
    assert ", 0 differ" in ok(run_jobs(v1, settings, "verify", spark=spark))
    # A replay from the start reads the added partitions from their first offset too.
    reason = ["--reason", "checkpoint lost"]
    ok(run_jobs(v1, settings, "rebuild", "--from-source", *reason, spark=spark))
    run_pipeline(spark, load_pipeline(str(v1), tmp_path), settings)
    assert state(settings.warehouse) == expected(first + second, 1)
    ok(run_jobs(v2, settings, "backfill", "--from-earliest", "--reason", "fix", spark=spark))
    assert state(settings.warehouse) == expected(first + second, 2)
    assert ", 0 differ" in ok(run_jobs(v2, settings, "verify", spark=spark))


def skipped_setup(spark, settings, kafka_config, new_topic, tmp_path):  # type: ignore[no-untyped-def]
    """900 records judged, 100 more produced, a skip from 900 to 950, and a run that
    judges 950..999: the range 900..949 was never judged."""
    topic = new_topic(1)
    v1, v2 = inventory_file(tmp_path, topic, 1), inventory_file(tmp_path, topic, 2)
    events = movements(1000, 4)
    produce_keyed(kafka_config, topic, events[:900])
    run_pipeline(spark, load_pipeline(str(v1), tmp_path), settings)
    produce_keyed(kafka_config, topic, events[900:])
    target = json.dumps({topic: {"0": 950}})
    skip = ["rewind", "--mode", "skip", "--to-offset", target, "--reason", "poison records"]
    ok(run_jobs(v1, settings, *skip, spark=spark))
    run_pipeline(spark, load_pipeline(str(v1), tmp_path), settings)
    assert state(settings.warehouse) == expected(events[:900] + events[950:], 1)
    return topic, v1, v2, events


def test_a_backfill_leaves_a_skipped_range_out(  # type: ignore[no-untyped-def]
    spark, settings, kafka_config, new_topic, tmp_path
) -> None:
    _topic, _v1, v2, events = skipped_setup(spark, settings, kafka_config, new_topic, tmp_path)
    dry = ok(
        run_jobs(
            v2, settings, "backfill", "--from-earliest", "--reason", "fix", "--preview", spark=spark
        )
    )
    assert "950 records" not in dry
    ok(run_jobs(v2, settings, "backfill", "--from-earliest", "--reason", "fix", spark=spark))
    assert state(settings.warehouse) == expected(events[:900] + events[950:], 2)
    assert ", 0 differ" in ok(run_jobs(v2, settings, "verify", spark=spark))


def test_a_reprocess_to_an_offset_inside_a_skipped_range_keeps_it_skipped(  # type: ignore[no-untyped-def]
    spark, settings, kafka_config, new_topic, tmp_path
) -> None:
    topic, _v1, v2, events = skipped_setup(spark, settings, kafka_config, new_topic, tmp_path)
    target = json.dumps({topic: {"0": 920}})
    rewind = ["rewind", "--to-offset", target, "--reason", "bad deploy at 920"]
    ok(run_jobs(v2, settings, *rewind, spark=spark))
    run_pipeline(spark, load_pipeline(str(v2), tmp_path), settings)
    want = dict(expected(events[:900], 1))
    for sku, qty in expected(events[950:], 2).items():
        want[sku] = want.get(sku, 0) + qty
    assert state(settings.warehouse) == want
    starts = [offsets_of(r, "start_offsets")[0] for r in batches(settings.warehouse)]
    assert 900 not in starts[1:], "a batch re-read the skipped range"


def test_a_version_number_names_one_definition_ever(  # type: ignore[no-untyped-def]
    spark, settings, kafka_config, new_topic, tmp_path
) -> None:
    topic = new_topic(1)
    v1, v2 = inventory_file(tmp_path, topic, 1), inventory_file(tmp_path, topic, 2)
    produce_keyed(kafka_config, topic, movements(50, 5))
    run_pipeline(spark, load_pipeline(str(v1), tmp_path), settings)
    ok(run_jobs(v2, settings, "backfill", "--from-earliest", "--reason", "fix", spark=spark))
    run_pipeline(spark, load_pipeline(str(v2), tmp_path), settings)
    # A third file that says version 1 again, with another filter.
    data = yaml.safe_load(v1.read_text())
    data["filter"] = "qty > 1"
    reused = tmp_path / "reused" / "inventory.yaml"
    reused.parent.mkdir()
    reused.write_text(yaml.safe_dump(data))
    done = run_jobs(reused, settings, "run", spark=spark)
    assert done.returncode == 2
    assert "version 1" in done.stderr and "filter" in done.stderr, done.stderr[-2000:]
