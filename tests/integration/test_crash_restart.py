"""Kill the driver (the whole process group, as a machine failure would) at the
points where a crash is most dangerous, rerun, and demand exact results."""

from __future__ import annotations

import json
import time

import pytest
from deltalake import DeltaTable

from jobs.settings import REPO_ROOT
from tests.conftest import (
    jobs_args,
    pipeline_file,
    produce,
    rotating,
    run_in_process,
    run_with_fault,
)
from tests.expected import clicks_per_window, state_as_counter
from tests.output_topic import (
    assert_published_like_the_changelog,
    expected_counts,
    last_values,
    read_output,
    state_table,
    with_output,
)

pytestmark = pytest.mark.integration
BAD = [b"broken", b'{"user_id": "z"}']


@pytest.mark.parametrize(
    ("faults", "where"),
    [
        # On a local disk, one of these two sequences per commit (``rotating``):
        *rotating(
            [
                # a task half-way through its changelog file; then, on the replay,
                # the changelog committed and the state merge not yet; then the
                # output transaction committed and Spark's own batch commit not yet
                (("during_task", "after_changelog@1", "after_output@2"), "local"),
                # dead letters committed; then every table committed and no output
                # transaction begun; then the output records sent, the transaction open
                (("after_dead_letter@0", "after_ledger@1", "during_output@2"), "local"),
            ]
        ),
        # On object storage: a task's file upload cut off (S3 has no partial
        # objects, and no rename makes one whole); then the state merged and no
        # ledger row; then the output transaction open. Each killed run's lease
        # holds until it expires; the next run takes it over.
        (("during_task", "after_state@1", "during_output@2"), "s3"),
    ],
)
def test_crash_and_restart_is_exact(
    spark, broker, kafka_config, new_topic, tmp_path, faults, where, request, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(3)
    now = int(time.time())
    values = [
        json.dumps({"user_id": f"u{i % 23}", "timestamp": now - 300 + i % 240}).encode()
        for i in range(2000)
    ] + BAD
    produce(kafka_config, topic, values)
    # At most 700 records per batch: several batches per run.
    output = f"out_{topic}"
    pipeline = with_output(
        pipeline_file(tmp_path, "user_clicks", topic, max_offsets_per_trigger=700), output
    )
    warehouse = tmp_path / "warehouse"
    if where == "s3":
        warehouse = request.getfixturevalue("s3_warehouse")
        monkeypatch.setenv("PLATFORM_LEASE_SECONDS", "2")

    for fault in faults:  # each run is killed at its point; the next one recovers
        assert run_with_fault(pipeline, broker.bootstrap_servers, warehouse, fault) == -9
    servers = broker.bootstrap_servers  # the recovering run: in this process
    assert run_with_fault(pipeline, servers, warehouse, None, spark=spark) == 0

    root = warehouse / "user_clicks"
    expected, dead, late = clicks_per_window([values])
    assert late == 0
    state = DeltaTable(str(root / "state")).to_pyarrow_table().to_pylist()
    assert state_as_counter(state, "clicks") == expected

    # The output topic, read_committed: every changelog row once, and read as a
    # table it is the state table and the plain-Python expectation.
    records = read_output(kafka_config, output)
    assert_published_like_the_changelog(records, warehouse)
    assert last_values(records) == state_table(warehouse) == expected_counts(values)
    if "during_output@2" in faults:  # the killed transaction's records: there, unseen
        everything = read_output(kafka_config, output, "read_uncommitted")
        batch_2 = [r for r in records if r["headers"]["platform.batch"] == "2"]
        assert len(everything) - len(records) == len(batch_2) > 0

    changelog = DeltaTable(str(root / "changelog")).to_pyarrow_table().to_pylist()
    keys = [(r["user_id"], r["window_start"], r["epoch"], r["batch_id"]) for r in changelog]
    assert len(keys) == len(set(keys)), "duplicate changelog rows"
    ledger = DeltaTable(str(root / "_ledger")).to_pyarrow_table().to_pylist()
    batches = [(r["epoch"], r["batch_id"]) for r in ledger]
    assert len(batches) == len(set(batches)), "a batch is in the ledger twice"
    assert sum(r["records_in"] for r in ledger) == len(values)
    dead_letters = DeltaTable(str(root / "dead_letter")).to_pyarrow_table().to_pylist()
    assert sorted(d["value"] for d in dead_letters) == sorted(BAD)
    assert len(dead_letters) == dead

    status = run_in_process(spark, jobs_args(pipeline, servers, warehouse, "status", "--json"))
    report = json.loads(status.stdout)
    assert report["problems"] == []
    assert all(p["lag"] == 0 for p in report["partitions"])


@pytest.mark.parametrize("guarantee", ["exactly_once", "at_least_once"])
def test_inventory_crash_after_the_state_commit_is_exact(
    spark, broker, kafka_config, new_topic, tmp_path, guarantee
) -> None:  # type: ignore[no-untyped-def]
    """The other reference pipeline (a running sum, no window), under both
    guarantees: killed after batch 1's state merge, rerun, the state is exact (an
    at-least-once replay may repeat changelog rows, never change a total)."""
    import yaml

    signs = {"receipt": 1, "sale": -1, "return": -1}
    events = [
        {"sku": f"S{i % 13}", "qty": 1 + i % 5, "kind": list(signs)[i % 3], "timestamp": 1700000000}
        for i in range(1500)
    ]
    topic = new_topic(2)
    produce(kafka_config, topic, [json.dumps(e).encode() for e in events] + BAD)
    data = yaml.safe_load((REPO_ROOT / "include" / "pipelines" / "inventory.yaml").read_text())
    data["source"].update({"topics": [topic], "max_offsets_per_trigger": 500})
    data["processing_guarantee"] = guarantee
    pipeline = tmp_path / "inventory.yaml"
    pipeline.write_text(yaml.safe_dump(data))
    warehouse = tmp_path / "warehouse"

    servers = broker.bootstrap_servers
    assert run_with_fault(pipeline, servers, warehouse, "after_state@1") == -9
    assert run_with_fault(pipeline, servers, warehouse, None, spark=spark) == 0

    expected: dict[str, list[int]] = {}
    for e in events:
        total = expected.setdefault(e["sku"], [0, 0])
        total[0] += signs[e["kind"]] * e["qty"]
        total[1] += 1
    root = warehouse / "inventory"
    state = DeltaTable(str(root / "state")).to_pyarrow_table().to_pylist()
    assert {r["sku"]: [r["quantity"], r["movements"]] for r in state} == expected
    ledger = DeltaTable(str(root / "_ledger")).to_pyarrow_table().to_pylist()
    batches = [(r["epoch"], r["batch_id"]) for r in ledger if r["entry_type"] == "batch"]
    assert len(batches) == len(set(batches))
    assert sum(r["records_in"] for r in ledger if r["entry_type"] == "batch") == len(events) + 2
    letters = DeltaTable(str(root / "dead_letter")).to_pyarrow_table().to_pylist()
    assert len({(r["partition"], r["offset"]) for r in letters}) == len(BAD)
    if guarantee == "exactly_once":  # at-least-once may repeat a replayed batch's rows
        assert len(letters) == len(BAD)
