"""The offsets a published state is made of, from the ledger (pure: no Spark)."""

from __future__ import annotations

import json
from typing import Any

from jobs.ledger import Step, epoch_steps, live_lineage
from jobs.operations.verify import layers, lineage, merge

T = "clicks"


def batch(epoch: int, batch_id: int, start: int, end: int) -> dict[str, Any]:
    return {
        "epoch": epoch,
        "batch_id": batch_id,
        "start_offsets": json.dumps({T: {"0": start}}),
        "end_offsets": json.dumps({T: {"0": end}}),
    }


def test_intervals_merge() -> None:
    assert merge({(T, 0): [(5, 9), (0, 5), (20, 30), (25, 40), (7, 7)]}) == {
        (T, 0): [(0, 9), (20, 40)]
    }


def test_a_rewind_replay_counts_once_and_a_skip_stays_out() -> None:
    batches = [batch(0, 0, 0, 400), batch(0, 1, 400, 800), batch(0, 2, 800, 1000)]
    # Rewind (reprocess) to batch 0's end: epoch 1 replays 400.. again.
    batches += [batch(1, 0, 400, 700)]
    steps = {1: Step("restore", (0, 0), None)}
    assert lineage(batches, live_lineage(steps, 1)) == {(T, 0): [(0, 700)]}  # not 700..1000: undone
    # Rewind (skip) to 1500: epoch 2 keeps epoch 1's state and reads from 1500.
    batches += [batch(2, 0, 1500, 1600)]
    steps[2] = Step("keep", (1, 0), None)
    assert lineage(batches, live_lineage(steps, 2)) == {(T, 0): [(0, 700), (1500, 1600)]}
    # Emptied (rebuild --from-source): only what the new epoch read.
    batches += [batch(3, 0, 0, 50)]
    steps[3] = Step("empty", None, None)
    assert lineage(batches, live_lineage(steps, 3)) == {(T, 0): [(0, 50)]}


def test_a_backfill_carries_the_range_it_recomputed() -> None:
    batches = [batch(0, 0, 0, 400), batch(1, 0, 900, 950)]
    steps = {1: Step("publish", (0, 0), ({(T, 0): 400}, {(T, 0): 900}))}
    assert lineage(batches, live_lineage(steps, 1)) == {(T, 0): [(0, 950)]}


def test_steps_come_from_done_rows_only() -> None:
    def row(entry: str, epoch: int, details: dict[str, Any]) -> dict[str, Any]:
        return {"entry_type": entry, "epoch": epoch, "details": json.dumps(details)}

    plan = {"state_action": "restore", "boundary": {"epoch": 0, "batch_id": 3}}
    steps = epoch_steps(
        [
            row("rewind", 1, {"dry_run": True, "plan": plan}),
            row("rewind", 1, {"phase": "started", "plan": plan}),
            row("rewind", 1, {"phase": "done", "plan": plan}),
            row("maintain", 1, {"phase": "done"}),
        ]
    )
    assert steps == {1: Step("restore", (0, 3), None)}


def test_disjoint_intervals_are_read_in_layers() -> None:
    reads = layers({(T, 0): [(0, 10), (20, 30)], (T, 1): [(5, 8)]})
    assert reads == [
        ({(T, 0): 0, (T, 1): 5}, {(T, 0): 10, (T, 1): 8}),
        ({(T, 0): 20, (T, 1): 8}, {(T, 0): 30, (T, 1): 8}),
    ]


def test_one_read_of_the_ledger_next_to_a_committing_stream(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A batch committed after verify read the ledger is in neither the lineage nor
    the state version compared (before: the lineage from one read, the version from
    a second, and a false drift)."""
    import time

    import pyarrow as pa
    from deltalake import write_deltalake

    from jobs.delta import layout as tables
    from jobs.ledger import snapshot
    from jobs.operations.verify import comparable_version, state_lineage
    from tests.output_tables import StateWriter, clicks_pipeline

    writer = StateWriter(tmp_path, clicks_pipeline())
    ledger = writer.layout.table(tables.LEDGER)

    def commit_batch(batch_id: int, counts: dict[str, int | None]) -> int:
        version = writer.batch(counts)
        row = {
            "application_id": writer.pipeline.application_id,
            "entry_type": "batch",
            "pipeline_version": 1,
            "processing_guarantee": "exactly_once",
            "commit_time": int(time.time() * 1_000_000),
            **batch(0, batch_id, 100 * batch_id, 100 * (batch_id + 1)),
            "delta_versions": json.dumps({"state_after": version}),
        }
        write_deltalake(
            str(ledger), pa.Table.from_pylist([row], tables.LEDGER_SCHEMA), mode="append"
        )
        return version

    first = commit_batch(0, {"a": 1})
    snap = snapshot(writer.layout)
    assert snap is not None
    commit_batch(1, {"a": 2})  # the stream, between verify's reads
    where, base, intervals = state_lineage(snap)
    assert (where, base, intervals) == ("epoch 0 batch 0", first, {(T, 0): [(0, 100)]})
    assert comparable_version(writer.layout, base, snap.epoch) == first


def test_a_backfill_keeps_the_judgments_of_the_batches_it_replaced() -> None:
    # A backfill from epoch 0's batch 4 replaced the state of batches 5..9, judging
    # their records with those batches' watermarks: no state to go back to, but
    # still the decisions the state reflects. From the earliest: all of them.
    recomputed = ({(T, 0): 500}, {(T, 0): 1000})
    live = live_lineage({1: Step("publish", (0, 4), recomputed)}, 1)
    assert [live.holds(0, b) for b in (4, 5)] == [True, False]
    assert [live.decided(0, b) for b in (4, 5, 9)] == [True, True, True]
    earliest = live_lineage({1: Step("publish", None, ({(T, 0): 0}, {(T, 0): 1000}))}, 1)
    assert not earliest.holds(0, 0) and earliest.decided(0, 9)
    # A rewind discards both: its epoch restarted from batch 2.
    rewound = live_lineage({1: Step("restore", (0, 2), None)}, 1)
    assert rewound.decided(0, 2) and not rewound.decided(0, 3)
