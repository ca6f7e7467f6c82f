"""Backfill after a bug fix: inventory v1 subtracts returns, v2 adds them back."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pytest
import yaml
from deltalake import DeltaTable

from jobs.delta.layout import AppLayout
from jobs.ledger import current_epoch
from jobs.pipeline.parser import load_pipeline
from jobs.settings import REPO_ROOT
from jobs.streaming.run import run_pipeline
from tests.conftest import jobs_args, produce, run_jobs, run_with_fault
from tests.output_topic import read_output
from tests.pause_harness import stopped

pytestmark = pytest.mark.integration
Seen = TypeVar("Seen")
SIGNS = {1: {"receipt": 1, "sale": -1, "return": -1}, 2: {"receipt": 1, "sale": -1, "return": 1}}


def signed_qty(version: int) -> str:
    """inventory's ``signed_qty`` expression in ``version`` (1: returns subtracted)."""
    cases = " ".join(
        f"WHEN '{kind}' THEN {'' if sign > 0 else '-'}qty" for kind, sign in SIGNS[version].items()
    )
    return f"CASE kind {cases} END"


def movements(n: int, salt: int) -> list[dict[str, Any]]:
    kinds = ["receipt", "receipt", "sale", "return"]
    return [
        {
            "sku": f"S{(i + salt) % 9}",
            "qty": 1 + (i * 3 + salt) % 7,
            "kind": kinds[(i + salt) % 4],
            "timestamp": 1700000000 + i,
        }
        for i in range(n)
    ]


def expected(events: list[dict[str, Any]], version: int) -> dict[str, int]:
    totals: Counter[str] = Counter()
    for e in events:
        totals[e["sku"]] += SIGNS[version][e["kind"]] * e["qty"]
    return dict(totals)


def pipeline_file(tmp_path: Path, topic: str, version: int) -> Path:
    data = yaml.safe_load((REPO_ROOT / "include" / "pipelines" / "inventory.yaml").read_text())
    data["source"]["topics"] = [topic]
    data["version"] = version
    data["derived"][0]["expr"] = signed_qty(version)
    data["output"] = {"topic": f"out_{topic}", "partitions": 2}
    directory = tmp_path / f"v{version}"
    directory.mkdir()
    path = directory / "inventory.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def topic_table(records: list[dict[str, Any]]) -> dict[str, int]:
    """The output topic read as a table: the last quantity per SKU."""
    last: dict[str, int] = {}
    for record in records:
        if record["value"] is None:
            last.pop(record["key"]["sku"], None)
        else:
            last[record["key"]["sku"]] = record["value"]["aggregates"]["quantity"]
    return last


def state(warehouse: Path, version: int | None = None) -> dict[str, int]:
    table = DeltaTable(str(warehouse / "inventory" / "state"), version=version)
    return {r["sku"]: r["quantity"] for r in table.to_pyarrow_table().to_pylist()}


def while_polling(
    read: Callable[[], Seen], action: Callable[[], subprocess.CompletedProcess[str]]
) -> tuple[subprocess.CompletedProcess[str], list[Seen]]:
    """``action``'s result, and what ``read`` returned, again and again, meanwhile
    (a reader of the state while a backfill publishes)."""
    seen: list[Seen] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            seen.append(read())

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        return action(), seen
    finally:
        done.set()
        poller.join()


def test_backfill_publishes_the_fix_atomically(
    spark, settings, kafka_config, new_topic, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(2)
    v1, v2 = pipeline_file(tmp_path, topic, 1), pipeline_file(tmp_path, topic, 2)
    first = movements(800, 1)
    produce(kafka_config, topic, [json.dumps(e).encode() for e in first])
    run_pipeline(spark, load_pipeline(str(v1), tmp_path), settings)
    assert state(settings.warehouse) == expected(first, 1)
    assert min(state(settings.warehouse).values()) < 0  # the impossible negative stock

    def backfill(*extra: str) -> subprocess.CompletedProcess[str]:
        reason = ["--reason", "returns were subtracted"]
        return run_jobs(v2, settings, "backfill", "--from-earliest", *reason, *extra, spark=spark)

    preview = backfill("--preview")
    assert preview.returncode == 0, preview.stderr
    assert "preview:" in preview.stdout and "keys changed" in preview.stdout
    plan_id = re.search(r"^plan: (\S+)$", preview.stdout, re.MULTILINE)
    assert plan_id, preview.stdout
    saved_plan = json.loads(
        (settings.warehouse / "inventory" / "_plans" / f"{plan_id.group(1)}.json").read_text()
    )
    assert saved_plan["extra"]["preview"]["keys_changed"] > 0
    files = list(Path(settings.warehouse / "inventory" / "_backfill").glob("preview-*.json"))
    report = json.loads(files[0].read_text())["preview"]
    changed = {k for k in expected(first, 1) if expected(first, 1)[k] != expected(first, 2)[k]}
    assert report["keys_changed"] == len(changed)
    assert report["totals"]["quantity"] == {
        "before": sum(expected(first, 1).values()),
        "after": sum(expected(first, 2).values()),
    }
    assert state(settings.warehouse) == expected(first, 1)  # a preview publishes nothing

    # A reader polling the state while the backfill publishes sees v1 or v2, never a mix.
    # Exactly the reviewed plan (its offsets; nothing recomputed but the state).
    reason = ["--reason", "returns were subtracted"]
    applied, seen = while_polling(
        lambda: state(settings.warehouse),
        lambda: run_jobs(
            v2, settings, "backfill", "--plan", plan_id.group(1), *reason, spark=spark
        ),
    )
    assert applied.returncode == 0, applied.stderr
    assert all(s in (expected(first, 1), expected(first, 2)) for s in seen), "half-corrected"
    assert state(settings.warehouse) == expected(first, 2)

    table = DeltaTable(str(settings.warehouse / "inventory" / "state"))
    commit = table.history(1)[0]  # one commit, tagged with the operation
    assert commit["operation"] == "MERGE" and commit["platform_operation"] == "backfill"
    assert commit["reason"] == "returns were subtracted" and commit["pipeline_version"] == "2"
    cdf = pa.table(
        table.load_cdf(starting_version=table.version(), ending_version=table.version()).read_all()
    ).to_pylist()
    post = {r["sku"]: r["quantity"] for r in cdf if r["_change_type"] == "update_postimage"}
    pre = {r["sku"]: r["quantity"] for r in cdf if r["_change_type"] == "update_preimage"}
    assert set(post) == set(pre) == changed
    assert all(
        pre[k] == expected(first, 1)[k] and post[k] == expected(first, 2)[k] for k in changed
    )

    # The output topic got the fix as corrections, in one transaction: the changed
    # keys, each once, with the fixed value.
    records = read_output(kafka_config, f"out_{topic}")
    corrections = [r for r in records if r["headers"]["platform.kind"] == "correction"]
    assert {r["headers"]["platform.operation"] for r in corrections} == {"backfill"}
    assert sorted(r["key"]["sku"] for r in corrections) == sorted(changed)
    assert all(
        r["value"]["aggregates"]["quantity"] == expected(first, 2)[r["key"]["sku"]]
        for r in corrections
    )
    assert topic_table(records) == expected(first, 2)

    # Before the new epoch's first batch, a rebuild continues from the backfill's cut
    # (its offsets, its corrected state), not from the last batch (which would undo it).
    early = run_jobs(v2, settings, "rebuild", "--reason", "right after the backfill")
    assert early.returncode == 0, early.stderr

    # The stream resumes from the backfill's end offsets with the corrected state.
    later = movements(300, 2)
    produce(kafka_config, topic, [json.dumps(e).encode() for e in later])
    summary = run_pipeline(spark, load_pipeline(str(v2), tmp_path), settings)
    assert summary.epoch == 2
    assert state(settings.warehouse) == expected(first + later, 2)
    assert topic_table(read_output(kafka_config, f"out_{topic}")) == expected(first + later, 2)
    ledger = DeltaTable(str(settings.warehouse / "inventory" / "_ledger")).to_pyarrow_table()
    entries = [r for r in ledger.to_pylist() if r["entry_type"] == "backfill"]
    details = [json.loads(r["details"]) for r in entries]
    assert sorted(d.get("phase", "dry") for d in details) == ["done", "dry", "started"]
    done_entry = next(d for d in details if d.get("phase") == "done")
    assert done_entry["result"]["rows_updated"] == len(changed)
    assert {r["pipeline_version"] for r in entries} == {2}


def test_backfill_publishes_a_new_definition_in_one_swap(
    spark, settings, kafka_config, new_topic, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    # v2 fixes the sign, adds an aggregation (the largest movement) and drops one
    # (the count): new state columns, which Spark's checkpoint cannot take.
    topic = new_topic(2)
    v1 = pipeline_file(tmp_path, topic, 1)
    v2 = pipeline_file(tmp_path, topic, 2)
    data = yaml.safe_load(v2.read_text())
    data["aggregations"] = [
        {"name": "quantity", "function": "sum", "field": "signed_qty"},
        {"name": "largest", "function": "max", "field": "qty"},
    ]
    v2.write_text(yaml.safe_dump(data))
    first = movements(600, 3)
    produce(kafka_config, topic, [json.dumps(e).encode() for e in first])
    run_pipeline(spark, load_pipeline(str(v1), tmp_path), settings)
    old = {k: {"quantity": q, "movements": n} for k, (q, n) in columns(first, 1).items()}

    def new(events: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
        largest: dict[str, int] = {}
        for e in events:
            largest[e["sku"]] = max(largest.get(e["sku"], 0), e["qty"])
        return {k: {"quantity": q, "largest": largest[k]} for k, q in expected(events, 2).items()}

    assert rows_by_sku(settings.warehouse) == old
    refused = run_jobs(v2, settings, "run", spark=spark)
    assert refused.returncode == 2 and "backfill --pipeline inventory" in refused.stderr
    # From a batch boundary it would build on the old columns: refused before any fence.
    now = datetime.now(UTC).isoformat(timespec="seconds")
    seeded = run_jobs(
        v2, settings, "backfill", "--from-datetime", now, "--reason", "seeded", spark=spark
    )
    assert seeded.returncode == 2 and "use --from-earliest" in seeded.stderr, seeded.stderr
    assert current_epoch(AppLayout(settings.warehouse, "inventory")) == 0

    backfill, seen = while_polling(
        lambda: rows_by_sku(settings.warehouse),
        lambda: run_jobs(
            v2,
            settings,
            "backfill",
            "--from-earliest",
            "--reason",
            "largest movement, no count",
            spark=spark,
        ),
    )
    assert backfill.returncode == 0, backfill.stderr
    assert all(s in (old, new(first)) for s in seen), "a reader saw a mix"
    assert old in seen and new(first) in seen
    assert rows_by_sku(settings.warehouse) == new(first)
    state_table = DeltaTable(str(settings.warehouse / "inventory" / "state"))
    commit = state_table.history(1)[0]
    assert commit["operation"] == "WRITE" and commit["platform_operation"] == "backfill"

    # The changelog keeps the old column (history) and gains the new one.
    changelog = DeltaTable(str(settings.warehouse / "inventory" / "changelog"))
    rows = changelog.to_pyarrow_table().to_pylist()
    assert {"movements", "largest"} <= set(rows[0])
    republished = [r for r in rows if r["batch_id"] == -1]
    assert {r["sku"]: r["largest"] for r in republished} == {
        k: v["largest"] for k, v in new(first).items()
    }
    assert all(r["movements"] is None for r in republished)

    # The output topic: every key republished with the new aggregates.
    records = read_output(kafka_config, f"out_{topic}")
    corrections = [r for r in records if r["headers"]["platform.kind"] == "correction"]
    assert sorted(r["key"]["sku"] for r in corrections) == sorted(new(first))
    assert all(r["value"]["aggregates"].keys() == {"quantity", "largest"} for r in corrections)
    assert topic_table(records) == expected(first, 2)

    # The stream goes on under v2, from the backfill's end offsets.
    later = movements(200, 4)
    produce(kafka_config, topic, [json.dumps(e).encode() for e in later])
    run_pipeline(spark, load_pipeline(str(v2), tmp_path), settings)
    assert rows_by_sku(settings.warehouse) == new(first + later)
    assert topic_table(read_output(kafka_config, f"out_{topic}")) == expected(first + later, 2)


def columns(events: list[dict[str, Any]], version: int) -> dict[str, tuple[int, int]]:
    counts = Counter(e["sku"] for e in events)
    return {k: (q, counts[k]) for k, q in expected(events, version).items()}


def rows_by_sku(warehouse: Path) -> dict[str, dict[str, int]]:
    """The state's aggregates per SKU, whatever the definition's columns."""
    table = DeltaTable(str(warehouse / "inventory" / "state")).to_pyarrow_table().to_pylist()
    hidden = {"sku", "epoch", "batch_id", "updated_at", "_records"}
    return {r["sku"]: {k: v for k, v in r.items() if k not in hidden} for r in table}


def test_a_backfill_killed_between_its_two_tables_is_completed_exactly_once(
    spark, settings, kafka_config, new_topic, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    """A batch killed after its state merge (an orphan the ledger does not hold);
    then a backfill killed after its state MERGE, before its changelog append; the
    run completing it killed at the same point too; the third run completes it.
    The changelog, the source of truth, has every correction once and ends where
    the state does."""
    topic = new_topic(2)
    v1, v2 = pipeline_file(tmp_path, topic, 1), pipeline_file(tmp_path, topic, 2)
    first = movements(500, 5)
    produce(kafka_config, topic, [json.dumps(e).encode() for e in first])
    run_pipeline(spark, load_pipeline(str(v1), tmp_path), settings)
    # A SKU with receipts only: v1 and v2 agree on it, so a backfill merge onto the
    # orphan finds nothing to change there.
    orphan = [
        {"sku": "SX", "qty": 2, "kind": "receipt", "timestamp": 1700000600 + i} for i in range(5)
    ]
    produce(kafka_config, topic, [json.dumps(e).encode() for e in orphan])
    servers = settings.bootstrap_servers
    assert run_with_fault(v1, servers, settings.warehouse, "after_state") == -9
    assert state(settings.warehouse)["SX"] == 10  # merged, not in the ledger
    events = first + orphan
    changed = {k for k, q in expected(events, 1).items() if q != expected(events, 2)[k]}
    assert changed and "SX" not in changed

    def backfill(fault: str | None) -> subprocess.CompletedProcess[str]:
        reason = ["--reason", "returns were subtracted"]
        if fault is None:  # the completing run: in this process
            return run_jobs(v2, settings, "backfill", "--from-earliest", *reason, spark=spark)
        env = {"PLATFORM_FAULT": fault}
        return run_jobs(v2, settings, "backfill", "--from-earliest", *reason, env=env)

    # The backfill recomputes what the ledger's batches read (the orphan's records
    # are the next batch's: the stream judges them); the orphan merge is undone.
    for _attempt in range(2):
        killed = backfill("during_operation")
        assert killed.returncode == -9, killed.stderr[-2000:]
        assert state(settings.warehouse) == expected(first, 2)  # merged, then killed
    done = backfill(None)
    assert done.returncode == 0, done.stderr[-2000:]
    # Previewed against the state it publishes onto: the ledger's, not the dead merges'.
    assert f"preview: {len(changed)} keys changed, 0 added" in done.stdout, done.stdout
    assert state(settings.warehouse) == expected(first, 2)
    corrections = [r for r in changelog(settings.warehouse) if r["batch_id"] == -1]
    assert sorted(r["sku"] for r in corrections) == sorted(changed)  # each once
    assert last_per_sku(changelog(settings.warehouse)) == expected(first, 2)
    assert topic_table(read_output(kafka_config, f"out_{topic}")) == expected(first, 2)

    later = movements(200, 6)
    produce(kafka_config, topic, [json.dumps(e).encode() for e in later])
    run_pipeline(spark, load_pipeline(str(v2), tmp_path), settings)
    assert state(settings.warehouse) == expected(events + later, 2)
    assert last_per_sku(changelog(settings.warehouse)) == expected(events + later, 2)


def changelog(warehouse: Path) -> list[dict[str, Any]]:
    return DeltaTable(str(warehouse / "inventory" / "changelog")).to_pyarrow_table().to_pylist()


def last_per_sku(rows: list[dict[str, Any]]) -> dict[str, int]:
    """The changelog replayed in commit order: the last quantity per SKU."""
    last: dict[str, int] = {}
    for r in sorted(rows, key=lambda r: (r["epoch"], r["batch_id"], r["commit_time"])):
        last[r["sku"]] = r["quantity"]
    return last


def test_a_backfill_is_computed_beside_the_running_stream(
    spark, settings, kafka_config, new_topic, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    """Blue/green: v1 runs continuously (150 records a batch) while the backfill to
    v2 recomputes what it had judged. Paused once its shadow is computed
    (``after_shadow``) until the stream has committed two more batches, the backfill
    then fences the stream and catches up on exactly the records those batches
    judged. The stream stops with the fence's line (exit 2) and commits nothing
    after it, and the result is stop-the-world's: every record judged once with v2,
    as plain Python computes it, on the state, the changelog and the output topic."""
    topic = new_topic(2)
    v1, v2 = pipeline_file(tmp_path, topic, 1), pipeline_file(tmp_path, topic, 2)
    data = yaml.safe_load(v1.read_text())
    data["source"]["max_offsets_per_trigger"] = 150
    data["trigger"] = {"mode": "available-now", "interval": "1 second"}
    v1.write_text(yaml.safe_dump(data))
    events = movements(1500, 7)
    produce(kafka_config, topic, [json.dumps(e).encode() for e in events])
    ledger = settings.warehouse / "inventory" / "_ledger"

    def entries(kind: str) -> list[dict[str, Any]]:
        if not DeltaTable.is_deltatable(str(ledger)):
            return []
        rows = DeltaTable(str(ledger)).to_pyarrow_table().to_pylist()
        return [r for r in rows if r["entry_type"] == kind]

    def until(condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + 180
        while not condition():
            assert stream.poll() is None and time.monotonic() < deadline, what
            time.sleep(0.3)

    def command(name: str, path: Path, *args: str, **env: str) -> subprocess.Popen[str]:
        argv = jobs_args(path, settings.bootstrap_servers, settings.warehouse, name, *args)
        return subprocess.Popen(
            [sys.executable, "-m", "jobs", *argv],
            cwd=REPO_ROOT,
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    stream = command("run", v1, "--trigger", "continuous", "--quiet")
    backfill = None
    try:
        until(lambda: bool(entries("batch")), "the stream committed no batch")
        reason = ["--reason", "returns were subtracted"]
        backfill = command(
            "backfill", v2, "--from-earliest", *reason, PLATFORM_PAUSE="after_shadow"
        )
        stopped(backfill)  # its shadow computed; nothing fenced
        held = len(entries("batch"))
        later = movements(600, 8)  # the stream has work while the backfill waits
        produce(kafka_config, topic, [json.dumps(e).encode() for e in later])
        until(lambda: len(entries("batch")) >= held + 2, "the stream committed no more")
        os.killpg(backfill.pid, signal.SIGCONT)
        said, err = backfill.communicate(timeout=300)
        assert backfill.returncode == 0, err[-3000:]
        _out, stopped_by = stream.communicate(timeout=120)
        assert stream.returncode == 2 and "moved to epoch" in stopped_by, stopped_by[-2000:]
    finally:
        for process in (stream, backfill):
            if process is not None and process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.communicate()
    assert "form: blue-green" in said, said
    shadow = re.search(r"shadow: recomputed (\d+) record", said)
    fenced = re.search(r"shadow: fenced catch-up: (\d+) record", said)
    assert shadow and fenced, said
    # What the ledger says the stream judged before the fence, counted here: the
    # shadow read part of it, the fenced catch-up exactly the rest.
    fence = min(r["commit_time"] for r in entries("fence"))
    batches = entries("batch")
    assert all(r["commit_time"] < fence for r in batches)  # nothing after the fence
    judged = sum(
        int(end) - int(json.loads(r["start_offsets"]).get(topic, {}).get(p, 0))
        for r in batches
        for p, end in json.loads(r["end_offsets"])[topic].items()
    )
    assert int(fenced.group(1)) > 0
    assert int(shadow.group(1)) + int(fenced.group(1)) == judged

    run_pipeline(spark, load_pipeline(str(v2), tmp_path), settings)  # reads on with v2
    assert state(settings.warehouse) == expected(events + later, 2)
    assert last_per_sku(changelog(settings.warehouse)) == expected(events + later, 2)
    assert topic_table(read_output(kafka_config, f"out_{topic}")) == expected(events + later, 2)
