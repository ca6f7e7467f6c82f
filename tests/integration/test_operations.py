"""Rebuild and rewind end to end: real broker, Spark and Delta; exact expected values
from plain Python over the produced events."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from deltalake import CommitProperties, DeltaTable

from jobs import kafka_admin
from jobs.errors import ConsistencyError
from jobs.operations.verify import run_verify
from jobs.pipeline.parser import load_pipeline
from jobs.settings import REPO_ROOT, Settings
from jobs.status import application_status
from jobs.streaming.run import run_pipeline
from jobs.warehouse import Location
from tests.conftest import recent_clicks as clicks
from tests.conftest import run_jobs
from tests.expected import clicks_per_window, state_as_counter
from tests.output_topic import (
    assert_each_change_once,
    expected_counts,
    last_values,
    read_output,
    state_table,
)

pytestmark = pytest.mark.integration


def assert_topic_is_the_state(settings: Settings, topic: str, *batches: list[bytes]) -> None:
    """The output topic read as a table equals the state table (and, with
    ``batches``, plain Python over them); no state version published a key twice."""
    records = read_output(kafka_admin.client_config(settings.bootstrap_servers), f"out_{topic}")
    assert_each_change_once(records)
    assert last_values(records) == state_table(settings.warehouse)
    if batches:
        assert last_values(records) == expected_counts(*batches)


def cli(
    path: Path, settings: Settings, *args: str, spark: Any = None
) -> subprocess.CompletedProcess[str]:
    return run_jobs(path, settings, *args, spark=spark)


def table(settings: Settings, name: str) -> list[dict[str, Any]]:
    path = Path(settings.warehouse) / "user_clicks" / name
    return DeltaTable(str(path)).to_pyarrow_table().to_pylist()


def assert_state(settings: Settings, *batches: list[bytes]) -> None:
    expected, _dead, late = clicks_per_window(list(batches))
    assert late == 0
    assert state_as_counter(table(settings, "state"), "clicks") == expected
    changelog = table(settings, "changelog")
    keys = [(r["user_id"], r["window_start"], r["epoch"], r["batch_id"]) for r in changelog]
    assert len(keys) == len(set(keys))


def audits(settings: Settings, operation: str) -> list[dict[str, Any]]:
    rows = [r for r in table(settings, "_ledger") if r["entry_type"] == operation]
    rows.sort(key=lambda r: r["commit_time"])
    return [{**r, "details": json.loads(r["details"])} for r in rows]


def test_rebuild_after_the_checkpoint_is_lost(spark, settings, clicks_app, tmp_path) -> None:  # type: ignore[no-untyped-def]
    app = clicks_app(2, output=True, max_offsets_per_trigger=400)
    pipeline, path = app.pipeline, app.path
    first = app.feed(clicks(1000, 1))
    shutil.rmtree(settings.warehouse / "user_clicks" / "_checkpoints" / "epoch=0")

    status = application_status(pipeline, settings)
    assert status.repair == "rebuild"
    assert any("checkpoint" in p and "missing" in p for p in status.problems)

    dry = cli(path, settings, "rebuild", "--reason", "checkpoint deleted", "--dry-run", spark=spark)
    assert dry.returncode == 0, dry.stderr
    assert "Spark state is seeded from: Delta state version" in dry.stdout
    assert "dry run: nothing was changed" in dry.stdout
    applied = cli(path, settings, "rebuild", "--reason", "checkpoint deleted", spark=spark)
    assert applied.returncode == 0, applied.stderr

    second = clicks(600, 2)
    app.produce(second)
    summary = app.run()
    assert summary.epoch == 1
    assert_state(settings, first, second)
    # The seed batch's offsets (Kafka held at the cut, the seed read) are written as
    # the Python sources before the JVM ones wrote them: their checkpoints resume.
    checkpoint = Path(settings.warehouse) / "user_clicks" / "_checkpoints" / "epoch=1"
    held, seeded = (checkpoint / "offsets" / "0").read_text().splitlines()[2:4]
    assert seeded == json.dumps({"seeded": 1})
    ledger = DeltaTable(str(settings.warehouse / "user_clicks" / "_ledger")).to_pyarrow_table()
    epoch_0 = [r for r in ledger.to_pylist() if r["entry_type"] == "batch" and r["epoch"] == 0]
    last = max(epoch_0, key=lambda r: r["batch_id"])
    assert json.loads(held) == json.loads(last["end_offsets"])  # the cut's offsets
    details = [json.loads(b.ledger["details"]) for b in summary.batches]
    windows = len(clicks_per_window([first])[0])
    assert details[0]["seed_rows"] == windows
    assert details[1]["seed_verified_rows"] == windows  # checked before batch 1's records
    assert_the_seed_check_sees_a_difference(spark, pipeline, checkpoint, tmp_path)
    entries = audits(settings, "rebuild")
    assert [(e["details"]["dry_run"], e["details"].get("phase")) for e in entries] == [
        (True, None),
        (False, "started"),
        (False, "done"),
    ]
    done = entries[2]
    assert done["details"]["epoch_before"] == 0 and done["epoch"] == 1
    assert done["details"]["reason"] == "checkpoint deleted"
    assert done["details"]["who"]
    assert done["details"]["result"]["seeded_rows"] == windows
    assert application_status(pipeline, settings).problems == []


def assert_the_seed_check_sees_a_difference(spark, pipeline, checkpoint: Path, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The check of Spark's state against the snapshot (the seed batch's state, batch
    0) passes on the snapshot and names the rows of one that differs."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from jobs.state_seed import contribution
    from jobs.streaming.analyser import resolve
    from jobs.streaming.seed import verify_seeded_state

    resolved = resolve(spark, pipeline)
    (seed,) = checkpoint.parent.glob("epoch=1.seed-*.parquet")  # named by its content
    rows = pq.read_table(seed)
    kept = Location.local_path(checkpoint)
    assert verify_seeded_state(spark, resolved, kept, Location.local_path(seed)) == rows.num_rows
    # One row's count changed, another row twice: both are named.
    column = contribution(pipeline.aggregations[0])
    changed = rows.column(column).to_pylist()
    changed[0] += 1
    field = rows.schema.field(column)
    at = rows.schema.get_field_index(column)
    altered = rows.set_column(at, field, pa.array(changed, field.type))
    altered = pa.concat_tables([altered, rows.slice(1, 1)])
    wrong = tmp_path / "wrong.seed.parquet"
    pq.write_table(altered, wrong)
    with pytest.raises(ConsistencyError, match="differs from the Delta snapshot") as found:
        verify_seeded_state(spark, resolved, kept, Location.local_path(wrong))
    message = str(found.value)
    assert f"({rows.num_rows} rows)" in message  # Spark's
    assert f"({rows.num_rows + 1} rows)" in message  # the altered snapshot's
    first = rows.slice(0, 1).to_pylist()[0]
    assert repr(first["user_id"]) in message and "not in Spark" in message


def test_rebuild_from_source(spark, settings, clicks_app, tmp_path) -> None:  # type: ignore[no-untyped-def]
    app = clicks_app(2, output=True, max_offsets_per_trigger=400)
    topic, path = app.topic, app.path
    first = app.feed(clicks(900, 3))
    applied = cli(
        path, settings, "rebuild", "--reason", "distrust delta", "--from-source", spark=spark
    )
    assert applied.returncode == 0, applied.stderr
    assert "published state table: empty" in applied.stdout
    # Emptied: every key's tombstone went out as a correction of the rebuild.
    assert re.search(r"output: \d+ record\(s\) of 1 state version\(s\) published", applied.stdout)
    assert_topic_is_the_state(settings, topic)
    assert state_table(settings.warehouse) == {}
    app.run()
    assert_state(settings, first)
    assert_topic_is_the_state(settings, topic, first)


def rewind_dry_run(path: Path, settings: Settings, spec: str, spark: Any) -> Any:
    """``rewind --to-offset spec --dry-run``, which must succeed."""
    dry = cli(
        path,
        settings,
        "rewind",
        "--to-offset",
        spec,
        "--reason",
        "replay",
        "--dry-run",
        spark=spark,
    )
    assert dry.returncode == 0, dry.stderr
    return dry


def test_rewind_reprocess_counts_every_event_once(spark, settings, clicks_app, tmp_path) -> None:  # type: ignore[no-untyped-def]
    app = clicks_app(1, output=True, max_offsets_per_trigger=400)
    topic, pipeline, path = app.topic, app.pipeline, app.path
    first = app.feed(clicks(1000, 4))  # batches end at 400, 800, 1000
    spec = json.dumps({topic: {"0": 500}})
    dry = rewind_dry_run(path, settings, spec, spark)
    assert f"{topic}[0]" in dry.stdout and "1000 ->      400" in dry.stdout
    assert "records to replay: 600" in dry.stdout
    applied = cli(path, settings, "rewind", "--to-offset", spec, "--reason", "replay", spark=spark)
    assert applied.returncode == 0, applied.stderr
    # The published state went back to the boundary (offset 400) in one commit,
    # and to the output topic as corrections of the rewind.
    assert sum(r["_records"] for r in table(settings, "state")) == 400
    assert_topic_is_the_state(settings, topic, first[:400])
    # Before the new epoch's first batch, the state is what the rewind began the
    # epoch from (batch 0's lineage), not the old epoch's last batch.
    result = run_verify(spark, pipeline, settings, echo=lambda _line: None)
    assert (result["differing_keys"], result["rows_compared"]) == (0, len(table(settings, "state")))
    assert result["as_of"] == "epoch 1 as its operation began it"
    records = read_output(kafka_admin.client_config(settings.bootstrap_servers), f"out_{topic}")
    corrections = {
        r["headers"]["platform.operation"]
        for r in records
        if r["headers"]["platform.kind"] == "correction"
    }
    assert corrections == {"rewind"}
    app.run()
    assert_state(settings, first)
    assert_topic_is_the_state(settings, topic, first)
    status = json.loads(cli(path, settings, "status", "--json", spark=spark).stdout)["output"]
    assert status["unpublished_versions"] == 0
    assert status["published_through"] == status["state_version"]


def test_a_reviewed_plan_is_applied_exactly_or_refused(
    spark, settings, clicks_app, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    app = clicks_app(1, output=True, max_offsets_per_trigger=400)
    topic, path = app.topic, app.path
    first, second = clicks(800, 8), clicks(300, 9)
    app.feed(first)  # batches end at 400, 800
    spec = json.dumps({topic: {"0": 400}})

    def dry_run() -> str:
        dry = rewind_dry_run(path, settings, spec, spark)
        found = re.search(r"^plan: (\S+)$", dry.stdout, re.MULTILINE)
        assert found, dry.stdout
        return found.group(1)

    stale = dry_run()
    app.feed(second)  # the application moves on: batch 2
    refused = cli(path, settings, "rewind", "--plan", stale, "--reason", "replay", spark=spark)
    assert refused.returncode == 2
    assert f"error: plan {stale}" in refused.stderr
    # How many batches the second run took depends on Spark (a no-data batch
    # follows one that moved the watermark): the refusal names the ledger's last.
    from jobs.delta.layout import AppLayout
    from jobs.ledger import last_batch

    now = last_batch(AppLayout(settings.warehouse, "user_clicks"))
    assert now is not None and now["batch_id"] >= 2
    moved = f"the last committed batch was epoch 0 batch 1, now epoch 0 batch {now['batch_id']}"
    assert moved in refused.stderr
    assert audits(settings, "rewind")[-1]["details"]["dry_run"]  # nothing was applied

    dry = rewind_dry_run(path, settings, spec, spark)
    reviewed, digest = re.findall(r"^plan(?: digest)?: (\S+)$", dry.stdout, re.MULTILINE)
    stored = Path(settings.warehouse, "user_clicks", "_plans", f"{reviewed}.json").read_bytes()
    assert digest == hashlib.sha256(stored).hexdigest()  # what the reviewer is shown
    why = ("--reason", "replay")
    other = cli(
        path, settings, "rewind", "--plan", reviewed, "--plan-digest", "0" * 64, *why, spark=spark
    )
    assert other.returncode == 2 and "is not the plan that was reviewed" in other.stderr
    applied = cli(
        path, settings, "rewind", "--plan", reviewed, "--plan-digest", digest, *why, spark=spark
    )
    assert applied.returncode == 0, applied.stderr
    assert f"applying plan {reviewed}" in applied.stdout
    done = audits(settings, "rewind")[-1]["details"]
    assert done["phase"] == "done" and done["plan"]["plan_id"] == reviewed
    assert done["plan"]["target_offsets"] == {topic: {"0": 400}}
    # A retry (Airflow's, after the task died past the apply) does nothing, and says so.
    again = cli(path, settings, "rewind", "--plan", reviewed, "--reason", "replay", spark=spark)
    assert again.returncode == 0, again.stderr
    assert f"plan {reviewed} was already applied" in again.stdout
    assert audits(settings, "rewind")[-1]["details"] == done
    app.run()
    assert_state(settings, first, second)
    assert_topic_is_the_state(settings, topic, first, second)


def test_a_changed_window_is_refused_before_spark_and_rebuilt_from_source(
    spark, settings, clicks_app, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    app = clicks_app(1, output=True, max_offsets_per_trigger=400)
    topic, path = app.topic, app.path
    first = app.feed(clicks(600, 10))
    data = yaml.safe_load(path.read_text())
    data["version"], data["window"]["size"] = 2, "2 minutes"
    path.write_text(yaml.safe_dump(data))
    change = "window [size, slide] (seconds) [60, 60] -> [120, 120]"

    refused = cli(path, settings, "run", spark=spark)
    assert refused.returncode == 2
    assert f"changes what Spark's state holds since epoch 0 began ({change})" in refused.stderr
    assert "rebuild --pipeline user_clicks --from-source" in refused.stderr
    # Seeding the new definition from the old state is refused the same way.
    seeded = cli(path, settings, "rebuild", "--reason", "new window", spark=spark)
    assert seeded.returncode == 2 and change in seeded.stderr

    rebuilt = cli(path, settings, "rebuild", "--from-source", "--reason", "new window", spark=spark)
    assert rebuilt.returncode == 0, rebuilt.stderr
    run_pipeline(spark, load_pipeline(str(path), tmp_path), settings)
    expected, _dead, late = clicks_per_window([first], window_s=120)
    assert late == 0
    assert state_as_counter(table(settings, "state"), "clicks") == expected

    # A backfill republishes under a new window: one from a batch boundary would
    # build on the old windows' state and is refused; one from the first offsets
    # recomputes it all and publishes it in one commit (and to the output topic).
    data["version"], data["window"]["size"] = 3, "3 minutes"
    path.write_text(yaml.safe_dump(data))
    seeded = cli(
        path, settings, "backfill", "--from-offset", "500", "--reason", "3 min", spark=spark
    )
    assert seeded.returncode == 2 and "the state it would be seeded from does not fit" in (
        seeded.stderr
    )
    backfill = cli(
        path, settings, "backfill", "--from-earliest", "--reason", "3 min windows", spark=spark
    )
    assert backfill.returncode == 0, backfill.stderr
    expected, _dead, late = clicks_per_window([first], window_s=180)
    assert late == 0
    assert state_as_counter(table(settings, "state"), "clicks") == expected
    assert_topic_is_the_state(settings, topic)  # (the state is checked above)
    run_pipeline(spark, load_pipeline(str(path), tmp_path), settings)  # the run fits its cut
    assert state_as_counter(table(settings, "state"), "clicks") == expected


def test_rewind_skip_leaves_out_exactly_the_skipped_records(
    spark, settings, clicks_app, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    app = clicks_app(1, output=True, max_offsets_per_trigger=400)
    topic, pipeline, path = app.topic, app.pipeline, app.path
    first, skipped, later = clicks(500, 5), clicks(300, 6), clicks(200, 7)
    app.feed(first)
    app.produce(skipped)
    back = cli(
        path,
        settings,
        "rewind",
        "--to-offset",
        "100",
        "--mode",
        "skip",
        "--reason",
        "x",
        spark=spark,
    )
    assert back.returncode == 2 and "only moves forward" in back.stderr
    applied = cli(
        path,
        settings,
        "rewind",
        "--to-latest",
        "--mode",
        "skip",
        "--reason",
        "bad data",
        spark=spark,
    )
    assert applied.returncode == 0, applied.stderr
    app.feed(later)
    assert_state(settings, first, later)
    entry = audits(settings, "rewind")[-1]
    assert entry["details"]["plan"]["skipped"] == {f"{topic}[0]": [500, 800]}
    assert entry["details"]["plan"]["records_skipped"] == 300

    # The drift check recomputes the state's lineage (without the skipped records):
    # nothing differs. A published value changed by hand is found and recorded.
    lines: list[str] = []
    result = run_verify(spark, pipeline, settings, echo=lines.append)
    windows = len(clicks_per_window([first, later])[0])
    assert (result["differing_keys"], result["rows_compared"]) == (0, windows), lines
    state = DeltaTable(str(settings.warehouse / "user_clicks" / "state"))
    user = table(settings, "state")[0]["user_id"]
    untouched = state.version()
    state.update(updates={"clicks": "clicks + 1"}, predicate=f"user_id = '{user}'")
    tampered = sum(1 for r in table(settings, "state") if r["user_id"] == user)
    with pytest.raises(ConsistencyError, match="differ from a recomputation"):
        run_verify(spark, pipeline, settings, echo=lines.append)
    assert audits(settings, "verify")[-1]["details"]["differing_keys"] == tampered
    assert any(f'"user_id": "{user}"' in line for line in lines)

    # A batch committed to the state but not yet to the ledger (a stream next to
    # verify) is left out of the comparison.
    state = DeltaTable(str(settings.warehouse / "user_clicks" / "state"))
    state.restore(untouched)
    state.update(
        updates={"clicks": "clicks + 1"},
        predicate=f"user_id = '{user}'",
        commit_properties=CommitProperties(
            custom_metadata={"platform_operation": "batch", "epoch": str(entry["epoch"])}
        ),
    )
    result = run_verify(spark, pipeline, settings, sample=0.5, echo=lines.append)
    assert result["differing_keys"] == 0 and result["state_version"] == state.version() - 1
    assert 0 < result["rows_compared"] < windows  # about half the keys


def test_two_operations_at_once_the_second_is_refused(settings, tmp_path) -> None:  # type: ignore[no-untyped-def]
    hold = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from jobs.delta.layout import AppLayout\n"
        "from jobs.lock import application_lock\n"
        "with application_lock(AppLayout(Path(sys.argv[1]), 'user_clicks'), 'rewind --reason a'):\n"
        "    print('held', flush=True); time.sleep(60)\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", hold, str(settings.warehouse)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        path = tmp_path / "user_clicks.yaml"
        shutil.copy(REPO_ROOT / "include" / "pipelines" / "user_clicks.yaml", path)
        second = cli(
            path, dataclasses.replace(settings), "rebuild", "--reason", "b", "--from-source"
        )
        assert second.returncode == 2
        assert "busy: held by rewind --reason a" in second.stderr
    finally:
        holder.kill()
        holder.wait()
