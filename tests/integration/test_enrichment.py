"""``enrich:`` end to end on the real broker, Spark and Delta: records joined to a
Delta dimension table, one version per batch, recorded in the ledger; missing and
duplicated keys are dead letters; a batch killed after the dimension changed
replays with the version it first joined. Expectations are plain Python."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml
from deltalake import DeltaTable, write_deltalake

from jobs import kafka_admin
from jobs.warehouse import Location
from tests.conftest import jobs_args, run_in_process, run_jobs, run_with_fault

pytestmark = pytest.mark.integration

MERCHANTS = {"m0": "books", "m1": "games", "m2": "books", "m3": "food"}


def write_merchants(path: Path, categories: dict[str, str], duplicated: str = "mdup") -> None:
    """The dimension: one row per merchant, and two rows for ``duplicated``."""
    ids = [*categories, duplicated, duplicated]
    rows = pa.table(
        {
            "id": ids,
            "category": [*categories.values(), "toys", "tools"],
            "region": ["eu" if i % 2 else "us" for i in range(len(ids))],
            # To the microsecond: what the stream reads of a table keeps them.
            "since": pa.array([since_us(m) for m in ids], pa.timestamp("us", tz="UTC")),
        }
    )
    write_deltalake(str(path), rows, mode="overwrite")


def since_us(merchant: str) -> int:
    return 1_700_000_000_000_000 + sum(map(ord, merchant)) * 1_001 + 7


def pipeline_file(directory: Path, topic: str, missing: str = "dead_letter") -> Path:
    data: dict[str, Any] = {
        "application_id": "merchant_sales",
        "source": {"topics": [topic], "starting_offsets": "earliest"},
        "schema": {"merchant_id": "string", "cents": "bigint"},
        "enrich": [
            {
                "name": "m",
                "table": "${warehouse}/dims/merchants",
                "on": "merchant_id = m.id",
                "missing": missing,
            }
        ],
        "derived": [
            {"name": "category", "expr": "coalesce(m.category, 'unknown')"},
            {"name": "since", "expr": "coalesce(unix_micros(m.since), 0)"},
        ],
        "keys": ["category"],
        "event_time": {"field": "kafka.timestamp"},
        "aggregations": [
            {"name": "orders", "function": "count"},
            {"name": "cents", "function": "sum", "field": "cents"},
            {"name": "latest", "function": "max", "field": "since"},
        ],
    }
    path = directory / "merchant_sales.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def orders(salt: int, n: int) -> list[tuple[str, int]]:
    merchants = [*MERCHANTS, "nobody", "mdup"]
    return [(merchants[(i * 7 + salt) % len(merchants)], 100 + i % 13) for i in range(n)]


def produce(config: dict[str, str], topic: str, records: list[tuple[str, int]]) -> None:
    now_ms = int(time.time() * 1000)
    values = [
        (None, json.dumps({"merchant_id": m, "cents": c}).encode(), now_ms) for m, c in records
    ]
    kafka_admin.produce_all(config, topic, values)  # type: ignore[arg-type]


def expected(
    batches: list[tuple[list[tuple[str, int]], dict[str, str]]],
    rows: frozenset[str] = frozenset(MERCHANTS),
) -> dict[str, tuple[int, int, int]]:
    """Per category: (orders, cents, latest merchant's since), each batch's records
    with its dimension (a merchant without a row of the table, ``rows``: since 0)."""
    orders_: Counter[str] = Counter()
    cents: Counter[str] = Counter()
    latest: dict[str, int] = {}
    for records, categories in batches:
        for merchant, amount in records:
            if merchant in categories:
                category = categories[merchant]
                orders_[category] += 1
                cents[category] += amount
                since = since_us(merchant) if merchant in rows else 0
                latest[category] = max(latest.get(category, since), since)
    return {k: (orders_[k], cents[k], latest[k]) for k in orders_}


def state(warehouse: Path) -> dict[str, tuple[int, int, int]]:
    rows = DeltaTable(str(warehouse / "merchant_sales" / "state")).to_pyarrow_table().to_pylist()
    return {r["category"]: (r["orders"], r["cents"], r["latest"]) for r in rows}


def ledger_batches(warehouse: Path) -> list[dict[str, Any]]:
    rows = DeltaTable(str(warehouse / "merchant_sales" / "_ledger")).to_pyarrow_table().to_pylist()
    batches = [r for r in rows if r["entry_type"] == "batch"]
    return sorted(batches, key=lambda r: (r["epoch"], r["batch_id"]))


def dead_letters(warehouse: Path) -> list[str]:
    table = DeltaTable(str(warehouse / "merchant_sales" / "dead_letter")).to_pyarrow_table()
    return sorted(table.column("reason").to_pylist())


def assert_each_bad_record_once(
    warehouse: Path, records: list[tuple[str, int]], bad: tuple[str, ...] = ("nobody", "mdup")
) -> None:
    """Every record whose merchant has no row or two (``bad``) is in ``dead_letter``
    exactly once, whatever the repairs judged again."""
    table = DeltaTable(str(warehouse / "merchant_sales" / "dead_letter")).to_pyarrow_table()
    columns = [table.column(c).to_pylist() for c in ("topic", "partition", "offset")]
    places = list(zip(*columns, strict=True))
    assert len(places) == len(set(places)), "a record is in dead_letter twice"
    assert len(places) == sum(1 for m, _ in records if m in bad)


def test_each_batch_joins_one_recorded_version_and_a_replay_joins_it_again(  # type: ignore[no-untyped-def]
    spark, broker, settings, kafka_config, new_topic, tmp_path
) -> None:
    topic = new_topic(2)
    dims = Path(settings.warehouse) / "dims" / "merchants"
    write_merchants(dims, MERCHANTS)
    path = pipeline_file(tmp_path, topic)

    first = orders(1, 400)
    produce(kafka_config, topic, first)
    assert (
        run_with_fault(path, broker.bootstrap_servers, settings.warehouse, None, spark=spark) == 0
    )
    assert state(settings.warehouse) == expected([(first, MERCHANTS)])
    nobody = sum(1 for m, _ in first if m == "nobody")
    twice = sum(1 for m, _ in first if m == "mdup")
    reasons = dead_letters(settings.warehouse)
    assert len(reasons) == nobody + twice
    assert reasons.count("enrich m: no row of " + str(dims) + " has id = nobody") == nobody
    assert reasons.count("enrich m: 2 rows of " + str(dims) + " have id = mdup") == twice

    # The dimension changes between batches: the next batch joins the new version.
    moved = {**MERCHANTS, "m1": "books"}
    write_merchants(dims, moved)
    second = orders(2, 300)
    produce(kafka_config, topic, second)
    assert (
        run_with_fault(path, broker.bootstrap_servers, settings.warehouse, None, spark=spark) == 0
    )
    assert state(settings.warehouse) == expected([(first, MERCHANTS), (second, moved)])

    # Killed after the batch's dead letters (before its changelog: the replay
    # computes the state again); the dimension changes before the restart: the
    # replay joins the version the batch joined first.
    third = orders(3, 300)
    produce(kafka_config, topic, third)
    killed = run_with_fault(path, broker.bootstrap_servers, settings.warehouse, "after_dead_letter")
    assert killed == -9
    write_merchants(dims, {**moved, "m2": "food"})
    assert (
        run_with_fault(path, broker.bootstrap_servers, settings.warehouse, None, spark=spark) == 0
    )
    assert state(settings.warehouse) == expected(
        [(first, MERCHANTS), (second, moved), (third, moved)]
    )
    table_id = DeltaTable(str(dims)).metadata().id
    pins = [json.loads(b["details"])["dimensions"]["m"] for b in ledger_batches(settings.warehouse)]
    assert {(p["id"], p["path"]) for p in pins} == {(table_id, str(dims))}
    versions = [p["version"] for p in pins]
    # Versions 0 and 1 were written before the first two batches; the kill's batch
    # was planned before version 2 (the change after the kill), and replayed with 1.
    assert versions == [0, 1, 1]
    assert DeltaTable(str(dims)).version() == 2
    # verify recomputes every batch with the version it recorded: no drift.
    checked = run_jobs(path, settings, "verify", spark=spark)
    assert checked.returncode == 0 and ", 0 differ" in checked.stdout, checked.stdout[-2000:]

    # A rewind that reprocesses from batch 0's end, with more orders since: the
    # replayed records join the version their batches recorded (1), the new ones
    # the version at their batch's time (2), and the batch records which is which.
    fourth = orders(5, 200)
    produce(kafka_config, topic, fourth)
    target = ledger_batches(settings.warehouse)[0]["end_offsets"]
    args = ("rewind", "--to-offset", target, "--mode", "reprocess", "--reason", "replay")
    rewound = run_jobs(path, settings, *args, spark=spark)
    assert rewound.returncode == 0, rewound.stderr[-2000:]
    assert "the replayed records join m at the versions their first batches recorded (1)" in (
        rewound.stdout
    ), rewound.stdout[-2000:]
    assert (
        run_with_fault(path, broker.bootstrap_servers, settings.warehouse, None, spark=spark) == 0
    )
    latest = {**moved, "m2": "food"}
    assert state(settings.warehouse) == expected(
        [(first, MERCHANTS), (second, moved), (third, moved), (fourth, latest)]
    )
    replay = json.loads(ledger_batches(settings.warehouse)[-1]["details"])
    assert replay["dimensions"] == {"m": {"version": 2, "id": table_id, "path": str(dims)}}
    replayed = len(second) + len(third)
    assert sum(r[3] - r[2] for r in replay["replayed"]) == replayed
    assert {r[4]["m"]["version"] for r in replay["replayed"]} == {1}
    assert_each_bad_record_once(settings.warehouse, first + second + third + fourth)
    status = run_jobs(path, settings, "status", spark=spark)
    assert "problems: none found" in status.stdout, status.stdout[-2000:]
    checked = run_jobs(path, settings, "verify", spark=spark)
    assert checked.returncode == 0 and ", 0 differ" in checked.stdout, checked.stdout[-2000:]


def test_a_backfill_keeps_the_recorded_versions_or_takes_the_newest_after_a_fix(  # type: ignore[no-untyped-def]
    spark, broker, settings, kafka_config, new_topic, tmp_path
) -> None:
    topic = new_topic(1)
    dims = Path(settings.warehouse) / "dims" / "merchants"
    write_merchants(dims, MERCHANTS)
    path = pipeline_file(tmp_path, topic, missing="keep")
    records = orders(4, 200)
    produce(kafka_config, topic, records)
    assert run_jobs(path, settings, "run", spark=spark).returncode == 0
    before = expected([(records, {**MERCHANTS, "nobody": "unknown"})])
    assert state(settings.warehouse) == before  # kept: the struct is NULL

    # The dimension is fixed (m3 was in the wrong category). A backfill of a code
    # change keeps the versions the batches joined; --dimensions newest takes the fix.
    fixed = {**MERCHANTS, "m3": "drinks"}
    write_merchants(dims, fixed)
    again = run_jobs(path, settings, "backfill", "--from-earliest", "--reason", "code", spark=spark)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "joins the table versions the batches recorded: m 0" in again.stdout
    assert state(settings.warehouse) == before
    args = ("backfill", "--from-earliest", "--dimensions", "newest", "--reason", "m3 fixed")
    newest = run_jobs(path, settings, *args, spark=spark)
    assert newest.returncode == 0, newest.stderr[-2000:]
    assert "joins each table's newest version (recorded -> newest): m 0 -> 1" in newest.stdout
    after_fix = expected([(records, {**fixed, "nobody": "unknown"})])
    assert state(settings.warehouse) == after_fix
    # The fix is what the coverage records now: verify agrees, and a later backfill
    # of a code change keeps it (the table moved on since: version 2 is not joined).
    write_merchants(dims, {**fixed, "m0": "games"})
    checked = run_jobs(path, settings, "verify", spark=spark)
    assert checked.returncode == 0 and ", 0 differ" in checked.stdout, checked.stdout[-2000:]
    later = run_jobs(path, settings, "backfill", "--from-earliest", "--reason", "code", spark=spark)
    assert later.returncode == 0, later.stderr[-2000:]
    assert "joins the table versions the batches recorded: m 1" in later.stdout
    assert state(settings.warehouse) == after_fix

    # A rebuild from the source replays every record through new batches: each joins
    # the version its range was last judged with (1, the fix), not the newest (2).
    args = ("rebuild", "--from-source", "--reason", "state lost")
    rebuilt = run_jobs(path, settings, *args, spark=spark)
    assert rebuilt.returncode == 0, rebuilt.stderr[-2000:]
    assert run_jobs(path, settings, "run", spark=spark).returncode == 0
    assert state(settings.warehouse) == after_fix
    checked = run_jobs(path, settings, "verify", spark=spark)
    assert checked.returncode == 0 and ", 0 differ" in checked.stdout, checked.stdout[-2000:]


def test_a_table_past_the_size_limit_stops_the_run_and_nothing_is_written(  # type: ignore[no-untyped-def]
    spark, broker, settings, tmp_path, kafka_config, new_topic, monkeypatch
) -> None:
    topic = new_topic(2)
    dims = Path(settings.warehouse) / "dims" / "merchants"
    # 300 rows with a 1,000-character category: about 330 KiB as JSON rows.
    wide = {f"w{i}": "x" * 1000 for i in range(300)}
    write_merchants(dims, {**MERCHANTS, **wide})
    path = pipeline_file(tmp_path, topic)
    records = orders(1, 400)
    produce(kafka_config, topic, records)
    argv = jobs_args(path, broker.bootstrap_servers, settings.warehouse, "run", "--quiet")

    for limit in ("64k", "1k"):
        monkeypatch.setenv("PLATFORM_DIMENSION_MAX_BYTES", limit)
        stopped = run_in_process(spark, argv)
        assert stopped.returncode == 2, stopped.stderr[-3000:]
        line = stopped.stderr.strip().splitlines()[-1]
        assert line.startswith(f"error: dimension table {dims} version 0 is over"), line
        assert "KiB as JSON rows, past the limit of " + limit.replace("k", " KiB") in line, line
        assert "PLATFORM_DIMENSION_MAX_BYTES" in line, line
        # Nothing of the batch: no state, no ledger batch, no dead letter.
        for table in ("state", "dead_letter"):
            folder = Path(settings.warehouse) / "merchant_sales" / table
            assert not folder.exists() or DeltaTable(str(folder)).to_pyarrow_table().num_rows == 0
        assert not ledger_batches(settings.warehouse)

    # Raised (the default), the same records are counted once.
    monkeypatch.delenv("PLATFORM_DIMENSION_MAX_BYTES")
    assert run_in_process(spark, argv).returncode == 0
    categories = {**MERCHANTS, **wide}
    assert state(settings.warehouse) == expected([(records, categories)])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"table": "/nonexistent/merchants"}, "enrich[0].table: /nonexistent/merchants cannot be"),
        (
            {"on": "merchant_id = m.code"},
            "has no column 'code' (it has id, category, region, since)",
        ),
        ({"on": "cents = m.id"}, "enrich[0].on: cents is a bigint and m.id a string"),
    ],
)
def test_spark_checks_the_tables_before_a_run(  # type: ignore[no-untyped-def]
    spark, settings, tmp_path, change: dict[str, str], message: str
) -> None:
    from jobs.errors import ConfigError
    from jobs.pipeline.parser import load_pipeline
    from jobs.streaming import analyser

    write_merchants(settings.warehouse / "dims" / "merchants", MERCHANTS)
    path = pipeline_file(tmp_path, "orders")
    data = yaml.safe_load(path.read_text())
    data["enrich"][0].update(change)
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as error:
        analyser.resolve(spark, load_pipeline(str(path), tmp_path), settings.warehouse)
    assert "\n" not in str(error.value) and message in str(error.value), str(error.value)


def test_a_warehouse_path_with_spaces_percent_hash_and_non_ascii_works_everywhere(  # type: ignore[no-untyped-def]
    spark, broker, settings, kafka_config, new_topic, tmp_path
) -> None:
    import dataclasses

    from jobs.metrics_exporter import exposition

    warehouse = tmp_path / "ware house 50% #1 é"
    settings = dataclasses.replace(settings, warehouse=warehouse)
    topic = new_topic(2)
    write_merchants(warehouse / "dims" / "merchants", MERCHANTS)
    path = pipeline_file(tmp_path, topic)
    batches = []
    for salt in (1, 2):  # the second run's start checks the first batch's cut
        records = orders(salt, 200)
        batches.append((records, MERCHANTS))
        produce(kafka_config, topic, records)
        done = run_jobs(path, settings, "run", "--quiet", spark=spark)
        assert done.returncode == 0, done.stderr[-2000:]
        assert state(warehouse) == expected(batches)
    status = run_jobs(path, settings, "status", spark=spark)
    assert status.returncode == 0 and "problems: none found" in status.stdout, status.stdout
    checked = run_jobs(path, settings, "verify", spark=spark)
    assert checked.returncode == 0 and ", 0 differ" in checked.stdout, checked.stdout[-2000:]
    target = ledger_batches(warehouse)[0]["end_offsets"]
    args = ("rewind", "--to-offset", target, "--mode", "reprocess", "--reason", "paths")
    rewound = run_jobs(path, settings, *args, spark=spark)
    assert rewound.returncode == 0, rewound.stderr[-2000:]
    done = run_jobs(path, settings, "run", "--quiet", spark=spark)
    assert done.returncode == 0, done.stderr[-2000:]
    assert state(warehouse) == expected(batches)
    committed = float(len(ledger_batches(warehouse)))
    line = 'platform_ledger_batches_total{application="merchant_sales",pipeline_version="1"}'
    assert f"{line} {committed}" in exposition(settings)


def test_enrich_added_by_a_new_version_runs_on_and_a_rewind_across_it_replays(  # type: ignore[no-untyped-def]
    spark, broker, settings, kafka_config, new_topic, tmp_path
) -> None:
    """Version 1 has no enrichment; the table is loaded after its batch, and version
    2 adds ``enrich:``. The next run goes on from where the stream is, and a rewind
    to the earliest offsets judges every record by version 2: a batch from before
    the table existed joins the table's first version."""
    topic = new_topic(2)
    path = pipeline_file(tmp_path, topic)
    v2 = yaml.safe_load(path.read_text())
    v1 = {k: v for k, v in v2.items() if k != "enrich"}
    v1["derived"] = [
        {"name": "category", "expr": "'unknown'"},
        {"name": "since", "expr": "CAST(0 AS BIGINT)"},
    ]
    path.write_text(yaml.safe_dump(v1, sort_keys=False))
    first = orders(1, 200)
    produce(kafka_config, topic, first)
    done = run_jobs(path, settings, "run", "--quiet", spark=spark)
    assert done.returncode == 0, done.stderr[-2000:]
    assert state(settings.warehouse) == {"unknown": (200, sum(c for _, c in first), 0)}

    time.sleep(1.1)  # the table's first commit is after the batch's planned time
    write_merchants(settings.warehouse / "dims" / "merchants", MERCHANTS)
    path.write_text(yaml.safe_dump({**v2, "version": 2}, sort_keys=False))
    second = orders(2, 200)
    produce(kafka_config, topic, second)
    done = run_jobs(path, settings, "run", "--quiet", spark=spark)
    assert done.returncode == 0, done.stderr[-2000:]
    as_v2 = expected([(second, MERCHANTS)])
    unknown = (200, sum(c for _, c in first), 0)
    assert state(settings.warehouse) == {**as_v2, "unknown": unknown}

    args = ("rewind", "--to-earliest", "--mode", "reprocess", "--reason", "across v2")
    rewound = run_jobs(path, settings, *args, spark=spark)
    assert rewound.returncode == 0, rewound.stderr[-2000:]
    done = run_jobs(path, settings, "run", "--quiet", spark=spark)
    assert done.returncode == 0, done.stderr[-2000:]
    assert state(settings.warehouse) == expected([(first, MERCHANTS), (second, MERCHANTS)])
    assert_each_bad_record_once(settings.warehouse, first + second)


def test_a_backfill_whose_fix_adds_a_missing_key_takes_its_records_out_of_dead_letter(  # type: ignore[no-untyped-def]
    spark, broker, settings, kafka_config, new_topic, tmp_path
) -> None:
    """A record whose key the dimension lacked is a dead letter; once the table has
    the key, ``backfill --dimensions newest`` aggregates it, and it is no longer in
    ``dead_letter``: each record in one place, through later runs and a rewind."""
    topic = new_topic(2)
    dims = Path(settings.warehouse) / "dims" / "merchants"
    write_merchants(dims, MERCHANTS)
    path = pipeline_file(tmp_path, topic)
    first = orders(6, 300)
    produce(kafka_config, topic, first)
    assert run_jobs(path, settings, "run", "--quiet", spark=spark).returncode == 0
    assert_each_bad_record_once(settings.warehouse, first)

    fixed = {**MERCHANTS, "nobody": "books"}
    write_merchants(dims, fixed)
    args = ("backfill", "--from-earliest", "--dimensions", "newest", "--reason", "nobody added")
    done = run_jobs(path, settings, *args, spark=spark)
    assert done.returncode == 0, done.stderr[-2000:]
    assert state(settings.warehouse) == expected([(first, fixed)], frozenset(fixed))
    assert_each_bad_record_once(settings.warehouse, first, bad=("mdup",))

    second = orders(7, 200)
    produce(kafka_config, topic, second)
    assert run_jobs(path, settings, "run", "--quiet", spark=spark).returncode == 0
    assert state(settings.warehouse) == expected(
        [(first, fixed), (second, fixed)], frozenset(fixed)
    )
    assert_each_bad_record_once(settings.warehouse, first + second, bad=("mdup",))
    status = run_jobs(path, settings, "status", spark=spark)
    assert "problems: none found" in status.stdout, status.stdout[-2000:]

    # A rewind to before the backfill: the replay judges every record again with the
    # version the backfill recorded (the fix) and the backfill's dead letters go.
    args = ("rewind", "--to-earliest", "--mode", "reprocess", "--reason", "again")
    assert run_jobs(path, settings, *args, spark=spark).returncode == 0
    assert run_jobs(path, settings, "run", "--quiet", spark=spark).returncode == 0
    assert state(settings.warehouse) == expected(
        [(first, fixed), (second, fixed)], frozenset(fixed)
    )
    assert_each_bad_record_once(settings.warehouse, first + second, bad=("mdup",))
    checked = run_jobs(path, settings, "verify", spark=spark)
    assert checked.returncode == 0 and ", 0 differ" in checked.stdout, checked.stdout[-2000:]


def checkpoint_records(warehouse: Path) -> dict[int, tuple[int, str, str]]:
    """What ``PinnedDeltaSource`` recorded per batch of the newest epoch's checkpoint:
    (version, path, table id)."""
    epochs = [
        p
        for p in (Path(warehouse) / "merchant_sales" / "_checkpoints").glob("epoch=*")
        if p.is_dir()
    ]
    newest = max(epochs, key=lambda p: int(p.name.split("=")[1]))
    found = {}
    for record in (newest / "dimensions").glob("[0-9]*"):
        version, where, table = record.read_text().splitlines()[:3]
        found[int(record.name.split("-")[0])] = (int(version), where, table)
    return found


def test_a_re_pointed_enrich_replays_each_record_with_the_table_its_batch_joined(  # type: ignore[no-untyped-def]
    spark, broker, settings, kafka_config, new_topic, tmp_path
) -> None:
    """Version 1 enriches from ``merchants``; version 2 points ``enrich`` at another
    table (``renamed``, its own version 0). Each batch records the table it read (id,
    location, version), and a backfill, ``verify`` and a rewind judge the first
    records with ``merchants`` again, never the new table at the old version number."""
    topic = new_topic(1)
    old_table = Path(settings.warehouse) / "dims" / "merchants"
    new_table = Path(settings.warehouse) / "dims" / "renamed"
    write_merchants(old_table, MERCHANTS)
    renamed = {m: c.upper() for m, c in MERCHANTS.items()}
    write_merchants(new_table, renamed)
    path = pipeline_file(tmp_path, topic)
    first = orders(8, 200)
    produce(kafka_config, topic, first)
    assert run_jobs(path, settings, "run", "--quiet", spark=spark).returncode == 0

    v2 = yaml.safe_load(path.read_text())
    v2["enrich"][0]["table"] = "${warehouse}/dims/renamed"
    path.write_text(yaml.safe_dump({**v2, "version": 2}, sort_keys=False))
    second = orders(9, 200)
    produce(kafka_config, topic, second)
    done = run_jobs(path, settings, "run", "--quiet", spark=spark)
    assert done.returncode == 0, done.stderr[-2000:]
    both = expected([(first, MERCHANTS), (second, renamed)])
    assert state(settings.warehouse) == both

    ids = {str(t): DeltaTable(str(t)).metadata().id for t in (old_table, new_table)}
    assert ids[str(old_table)] != ids[str(new_table)]
    pins = [json.loads(r["details"])["dimensions"]["m"] for r in ledger_batches(settings.warehouse)]
    assert [(p["path"], p["id"], p["version"]) for p in pins] == [
        (str(old_table), ids[str(old_table)], 0),
        (str(new_table), ids[str(new_table)], 0),
    ]
    # The checkpoint's record of each batch is what the ledger recorded.
    last = ledger_batches(settings.warehouse)[-1]
    records = checkpoint_records(settings.warehouse)
    assert last["batch_id"] in records, (records, last)
    recorded = records[last["batch_id"]]
    assert recorded == (pins[-1]["version"], pins[-1]["path"], pins[-1]["id"])

    again = run_jobs(path, settings, "backfill", "--from-earliest", "--reason", "code", spark=spark)
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"m 0, 0 of {old_table}" in again.stdout or f"m 0 of {old_table}, 0" in again.stdout
    assert state(settings.warehouse) == both
    checked = run_jobs(path, settings, "verify", spark=spark)
    assert checked.returncode == 0 and ", 0 differ" in checked.stdout, checked.stdout[-2000:]

    args = ("rewind", "--to-earliest", "--mode", "reprocess", "--reason", "across v2")
    rewound = run_jobs(path, settings, *args, spark=spark)
    assert rewound.returncode == 0, rewound.stderr[-2000:]
    done = run_jobs(path, settings, "run", "--quiet", spark=spark)
    assert done.returncode == 0, done.stderr[-2000:]
    assert state(settings.warehouse) == both
    assert_each_bad_record_once(settings.warehouse, first + second)


def test_a_dimension_deleted_and_loaded_again_is_another_table(  # type: ignore[no-untyped-def]
    spark, broker, settings, kafka_config, new_topic, tmp_path
) -> None:
    """The table is deleted and loaded again at the same path: it starts again at
    version 0 with another table id. The stream runs on with the new table; a
    recomputation of the batches that joined the old one refuses with one line naming
    the repair, and ``backfill --dimensions newest`` is that repair."""
    import shutil

    topic = new_topic(1)
    dims = Path(settings.warehouse) / "dims" / "merchants"
    write_merchants(dims, MERCHANTS)
    path = pipeline_file(tmp_path, topic)
    first = orders(10, 200)
    produce(kafka_config, topic, first)
    assert run_jobs(path, settings, "run", "--quiet", spark=spark).returncode == 0
    assert state(settings.warehouse) == expected([(first, MERCHANTS)])

    shutil.rmtree(dims)
    fixed = {**MERCHANTS, "m3": "drinks"}
    write_merchants(dims, fixed)
    second = orders(11, 200)
    produce(kafka_config, topic, second)
    done = run_jobs(path, settings, "run", "--quiet", spark=spark)
    assert done.returncode == 0, done.stderr[-2000:]
    runs_on = expected([(first, MERCHANTS), (second, fixed)])
    assert state(settings.warehouse) == runs_on

    for args in (
        ("backfill", "--from-earliest", "--reason", "code"),
        ("rewind", "--to-earliest", "--mode", "reprocess", "--reason", "again"),
    ):
        refused = run_jobs(path, settings, *args, spark=spark)
        assert refused.returncode != 0
        lines = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
        assert len(lines) == 1, refused.stderr[-2000:]
        assert "deleted and loaded again" in lines[0] and "backfill --dimensions newest" in lines[0]
        assert state(settings.warehouse) == runs_on
    checked = run_jobs(path, settings, "verify", spark=spark)
    assert "deleted and loaded again" in checked.stderr, checked.stderr[-2000:]

    args = ("backfill", "--from-earliest", "--dimensions", "newest", "--reason", "reloaded")
    repaired = run_jobs(path, settings, *args, spark=spark)
    assert repaired.returncode == 0, repaired.stderr[-2000:]
    assert state(settings.warehouse) == expected([(first, fixed), (second, fixed)])
    checked = run_jobs(path, settings, "verify", spark=spark)
    assert checked.returncode == 0 and ", 0 differ" in checked.stdout, checked.stdout[-2000:]
    args = ("rewind", "--to-earliest", "--mode", "reprocess", "--reason", "after repair")
    assert run_jobs(path, settings, *args, spark=spark).returncode == 0
    assert run_jobs(path, settings, "run", "--quiet", spark=spark).returncode == 0
    assert state(settings.warehouse) == expected([(first, fixed), (second, fixed)])
    assert_each_bad_record_once(settings.warehouse, first + second)


def test_the_loader_measures_a_table_as_the_stream_keeps_it(  # type: ignore[no-untyped-def]
    spark, tmp_path, monkeypatch
) -> None:
    """A table the loader accepts is one every stream can join: both measure its rows
    as the stream keeps them (timestamps to the microsecond), so a limit one byte
    under that size refuses the load, and at that size both take it."""
    from jobs.dimension_load import Dimension, read_checked
    from jobs.errors import ConfigError
    from jobs.streaming.enrichment import FORMAT

    source = tmp_path / "stamps.json"
    source.write_text('{"id": "a", "ts": "2024-01-01T00:00:00Z"}\n')
    columns = {"id": "string", "ts": "timestamp"}
    dimension = Dimension("stamps", "", str(source), "id", columns, None)
    # Plain Python: the key, the row as the stream writes it, and 6 bytes of framing.
    kept = len("a") + len('{"id":"a","ts":"2024-01-01T00:00:00.000000Z"}') + 6
    monkeypatch.setenv("PLATFORM_DIMENSION_MAX_BYTES", str(kept - 1))
    with pytest.raises(ConfigError, match="past PLATFORM_DIMENSION_MAX_BYTES"):
        read_checked(spark, dimension, Location.local_path(source))
    monkeypatch.setenv("PLATFORM_DIMENSION_MAX_BYTES", str(kept))
    rows = read_checked(spark, dimension, Location.local_path(source))
    table = tmp_path / "dims" / "stamps"
    rows.drop("_corrupt_record").write.format("delta").save(str(table))
    rows.unpersist()

    def stream_reads(limit: int) -> int:
        read = spark.read.format(FORMAT).options(
            path=str(table), key="id", version="0", maxBytes=str(limit)
        )
        return int(read.load().collect()[0]["_dim_version"])

    assert stream_reads(kept) == 0
    with pytest.raises(Exception, match="past the limit"):
        stream_reads(kept - 1)
