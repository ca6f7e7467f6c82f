"""Two engines, one set of tables: delta-spark (the platform's Spark jobs, a user's
Spark) and delta-rs (the JVM-free tools) read every table of an application the
same, at every version a rewind or a reader may ask for."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from jobs.pipeline.parser import load_pipeline
from jobs.settings import REPO_ROOT
from jobs.streaming.run import run_pipeline
from tests.conftest import pipeline_file, produce, run_jobs
from tests.expected import clicks_per_window

pytestmark = pytest.mark.integration

TABLES = ("changelog", "state", "dead_letter", "raw", "_ledger")


def canonical(value: Any) -> Any:
    """One comparable form of a cell, whichever engine's Arrow it came from."""
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dict):
        return tuple(sorted((k, canonical(v)) for k, v in value.items()))
    if isinstance(value, list):
        # A map arrives as a list of (key, value) pairs from one engine.
        return tuple(canonical(v) for v in value)
    return value


def rows_of(table: Any) -> list[tuple[Any, ...]]:
    names = sorted(table.column_names)
    return sorted((tuple(canonical(row[n]) for n in names) for row in table.to_pylist()), key=repr)


def test_both_engines_read_every_table_the_same_at_every_version(
    spark, settings, kafka_config, new_topic, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(2)
    path = pipeline_file(tmp_path, "user_clicks", topic, archive=True, max_offsets_per_trigger=300)
    now = int(time.time())
    values = [
        json.dumps({"user_id": f"u{i % 11}", "timestamp": now - 250 + i % 200}).encode()
        for i in range(900)
    ] + [b"not json", b'{"user_id": "u1", "timestamp": "soon"}']
    produce(kafka_config, topic, values)
    run_pipeline(spark, load_pipeline(str(path), tmp_path), settings)
    # An operation's commits too: a backfill publishes state and changelog anew.
    backfill = run_jobs(
        path, settings, "backfill", "--from-earliest", "--reason", "engines", spark=spark
    )
    assert backfill.returncode == 0, backfill.stderr

    app = Path(settings.warehouse) / "user_clicks"
    compared = 0
    for name in TABLES:
        latest = DeltaTable(str(app / name)).version()
        for version in sorted({0, 1, latest // 2, latest}):
            by_rs = DeltaTable(str(app / name), version=version).to_pyarrow_table()
            by_spark = (
                spark.read.format("delta").option("versionAsOf", version).load(str(app / name))
            ).toArrow()
            assert sorted(by_spark.column_names) == sorted(by_rs.column_names), (name, version)
            assert rows_of(by_spark) == rows_of(by_rs), (name, version)
            compared += by_rs.num_rows
    assert compared > len(values)  # not a comparison of empty tables

    # Independently of both engines: the state is the plain-Python count.
    expected, dead, _late = clicks_per_window([values])
    state = spark.read.format("delta").load(str(app / "state")).collect()
    got = Counter({(r["user_id"], int(r["window_start"].timestamp())): r["clicks"] for r in state})
    assert got == expected
    assert spark.read.format("delta").load(str(app / "dead_letter")).count() == dead == 2


def docs_block() -> str:
    """docs/pipelines.md's "Reading the tables from your own Spark" code, as it is."""
    text = (REPO_ROOT / "docs" / "pipelines.md").read_text()
    found = re.search(r"<!-- read-tables:[^>]*-->\n```python\n(.*?)```", text, re.S)
    assert found, "docs/pipelines.md's read-tables block is missing"
    return found.group(1)


def test_a_users_spark_reads_state_changelog_and_history(
    spark, settings, kafka_config, new_topic, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(1)
    path = pipeline_file(tmp_path, "user_clicks", topic, max_offsets_per_trigger=250)
    now = int(time.time())
    values = [
        json.dumps({"user_id": f"u{i % 5}", "timestamp": now - 200 + i % 120}).encode()
        for i in range(600)
    ]
    produce(kafka_config, topic, values)
    run_pipeline(spark, load_pipeline(str(path), tmp_path), settings)

    # The docs' code in a process of its own (a user's session, not the
    # platform's), then what the test reads of the frames it defined.
    script = docs_block().replace('state.orderBy("user_id", "window_start").show()\n', "") + (
        "import json\n"
        "def dump(name, frame):\n"
        "    for row in frame.collect():\n"
        "        print(json.dumps([name, row.asDict()], default=str))\n"
        "dump('state', state)\n"
        "dump('changelog', changelog)\n"
        "dump('first_batch', first_batch)\n"
        "dump('changes', changes.select('user_id', 'window_start', 'clicks', '_change_type'))\n"
    )
    app = Path(settings.warehouse) / "user_clicks"
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO_ROOT,
        env={**os.environ, "APP": str(app)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows: dict[str, list[dict[str, Any]]] = {}
    for line in done.stdout.splitlines():
        if line.startswith("["):
            name, row = json.loads(line)
            rows.setdefault(name, []).append(row)

    def counts(found: list[dict[str, Any]]) -> Counter[tuple[str, int]]:
        return Counter(
            {
                (r["user_id"], int(datetime.fromisoformat(r["window_start"]).timestamp())): r[
                    "clicks"
                ]
                for r in found
            }
        )

    # 600 records, 250 per trigger: batches of 250, 250 and 100 records.
    batches = [values[:250], values[250:500], values[500:]]
    assert counts(rows["state"]) == clicks_per_window(batches)[0]
    assert counts(rows["first_batch"]) == clicks_per_window(batches[:1])[0]
    # The changelog holds every batch's new values: the last per key is the state.
    last: dict[tuple[str, int], dict[str, Any]] = {}
    for row in sorted(rows["changelog"], key=lambda r: r["batch_id"]):
        last[(row["user_id"], row["window_start"])] = row
    assert counts(list(last.values())) == clicks_per_window(batches)[0]
    assert sorted({r["batch_id"] for r in rows["changelog"]}) == [0, 1, 2]
    # The change feed from version 1 on: batch 0's rows inserted, later ones updated.
    kinds = Counter(r["_change_type"] for r in rows["changes"])
    assert kinds["insert"] == len(clicks_per_window(batches[:1])[0]) and kinds["update_postimage"]
