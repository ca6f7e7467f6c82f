"""What the state covers (``jobs/lineage.py``): offsets, gaps and judges, from
the ledger's rows (pure: no Spark)."""

from __future__ import annotations

import json
from typing import Any

from jobs.ledger import epoch_steps
from jobs.lineage import BatchEntry, Boundary, History, Pin, Step, layers

T = "clicks"
P = (T, 0)


def entry(epoch: int, batch_id: int, start: int, end: int, watermark: int = 0) -> BatchEntry:
    return BatchEntry(epoch, batch_id, {P: start}, {P: end}, watermark, 0, batch_id)


def batch(epoch: int, batch_id: int, start: int, end: int) -> dict[str, Any]:
    return {
        "epoch": epoch,
        "batch_id": batch_id,
        "start_offsets": json.dumps({T: {"0": start}}),
        "end_offsets": json.dumps({T: {"0": end}}),
    }


def judged(batches: list[BatchEntry], steps: dict[int, Step], epoch: int) -> Any:
    return History(batches, steps, epoch).head.judged()


def test_a_rewind_replay_counts_once_and_a_skip_stays_out() -> None:
    batches = [entry(0, 0, 0, 400), entry(0, 1, 400, 800), entry(0, 2, 800, 1000)]
    # Rewind (reprocess) to batch 0's end: epoch 1 replays 400.. again.
    batches += [entry(1, 0, 400, 700)]
    steps = {1: Step("restore", (0, 0))}
    assert judged(batches, steps, 1) == {P: [(0, 700)]}  # not 700..1000: undone
    # Rewind (skip) to 1500: epoch 2 keeps epoch 1's state and reads from 1500.
    batches += [entry(2, 0, 1500, 1600)]
    steps[2] = Step("keep", (1, 0), {P: (700, 1500)})
    history = History(batches, steps, 2)
    assert history.head.judged() == {P: [(0, 700), (1500, 1600)]}
    assert history.head.gaps() == {P: [(700, 1500)]}
    # Emptied (rebuild --from-source): only what the new epoch read.
    batches += [entry(3, 0, 0, 50)]
    steps[3] = Step("empty", None)
    assert judged(batches, steps, 3) == {P: [(0, 50)]}


def test_a_backfill_covers_what_the_state_judged_and_no_gap() -> None:
    # 0..900 judged, a skip to 950, 950..1000 judged, then a backfill (from batch 0).
    batches = [entry(0, 0, 0, 400), entry(0, 1, 400, 900), entry(1, 0, 950, 1000)]
    steps = {1: Step("keep", (0, 1), {P: (900, 950)}), 2: Step("publish", (0, 0))}
    history = History(batches, steps, 2)
    assert history.head.judged() == {P: [(0, 900), (950, 1000)]}
    at = history.at(0, 0)
    assert history.head.excluding(at) == {P: [(400, 900), (950, 1000)]}
    # The batches it replaced are no state to go back to; their judgments stay.
    assert [history.holds(0, b) for b in (0, 1)] == [True, False]
    assert [d[4] for d in history.head.decisions()] == [0, 0, 0]


def test_a_target_inside_a_skipped_range_is_reached_at_its_end() -> None:
    batches = [entry(0, 0, 0, 900)]
    steps = {1: Step("keep", (0, 0), {P: (900, 950)}, state_version=7)}
    history = History(batches, steps, 1)
    points = history.boundaries({1: ({P: 950}, 0)})
    assert [(b.epoch, b.batch_id) for b in points] == [(0, 0), (1, -1)]
    assert history.latest_before(points, {P: 920}) == Boundary(1, -1, {P: 950}, 7)
    assert history.latest_before(points, {P: 899}) is None
    assert history.latest_before(points, {P: 900}) == Boundary(1, -1, {P: 950}, 7)


def test_a_partition_that_appears_mid_epoch_enters_at_its_first_offset() -> None:
    q = (T, 1)
    batches = [
        BatchEntry(0, 0, {P: 0}, {P: 10}),
        BatchEntry(0, 1, {P: 10, q: 0}, {P: 20, q: 5}),
    ]
    assert History(batches, {}, 0).head.judged() == {P: [(0, 20)], q: [(0, 5)]}


def test_one_read_of_the_ledger_next_to_a_committing_stream(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A batch committed after verify read the ledger is in neither the lineage nor
    the state version compared (before: the lineage from one read, the version from
    a second, and a false drift)."""
    import time

    import pyarrow as pa
    from deltalake import write_deltalake

    from jobs.delta import layout as tables
    from jobs.ledger import current_ledger
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
    ledger_now = current_ledger(writer.layout)
    assert ledger_now is not None
    commit_batch(1, {"a": 2})  # the stream, between verify's reads
    where, base, intervals, floor = state_lineage(ledger_now)
    assert (where, base, intervals) == ("epoch 0 batch 0", first, {(T, 0): [(0, 100)]})
    assert floor is None
    assert comparable_version(writer.layout, base, ledger_now.epoch) == first


def test_steps_come_from_done_rows_only() -> None:
    def row(entry: str, epoch: int, details: dict[str, Any]) -> dict[str, Any]:
        return {"entry_type": entry, "epoch": epoch, "details": json.dumps(details)}

    plan = {"state_action": "keep", "boundary": {"epoch": 0, "batch_id": 3}}
    skip = {**plan, "skipped": {"a[b][2]": [5, 9]}}
    steps = epoch_steps(
        [
            row("rewind", 1, {"dry_run": True, "plan": plan}),
            row("rewind", 1, {"phase": "started", "plan": plan}),
            row("rewind", 1, {"phase": "done", "plan": skip}),
            row("maintain", 1, {"phase": "done"}),
        ]
    )
    assert steps == {1: Step("keep", (0, 3), {("a[b]", 2): (5, 9)})}


def test_disjoint_intervals_are_read_in_layers() -> None:
    reads = layers({(T, 0): [(0, 10), (20, 30)], (T, 1): [(5, 8)]})
    assert reads == [
        ({(T, 0): 0, (T, 1): 5}, {(T, 0): 10, (T, 1): 8}),
        ({(T, 0): 20, (T, 1): 8}, {(T, 0): 30, (T, 1): 8}),
    ]


def test_a_recreated_topic_starts_the_coverage_at_the_repair_that_kept_the_state() -> None:
    # Epochs 0-1 read the topic's deleted log (a skip there left a gap at 40..60);
    # epoch 2 is the repair (rewind --to-earliest --mode skip: state kept) onto the
    # new log, whose offsets start again at 0.
    batches = [entry(0, 0, 0, 40), entry(1, 0, 60, 90), entry(2, 0, 0, 30)]
    steps = {
        1: Step("keep", (0, 0), {P: (40, 60)}, state_version=3),
        2: Step("keep", (1, 0), {}, state_version=6),
    }
    history = History(batches, steps, 2, excluded=frozenset({0, 1}))
    # Nothing of the deleted log: no judged range, and no gap of its offsets.
    assert history.head.judged() == {P: [(0, 30)]}
    assert history.head.gaps() == {}
    # The state the repair kept holds the deleted log's judgments: recomputations of
    # the new log start from there, never from empty state.
    assert history.floor == 2
    assert list(history.upto) == [2]
    assert History(batches, steps, 2).floor is None  # one log: no floor


def test_each_judged_range_carries_the_dimension_versions_its_batch_joined() -> None:
    import dataclasses

    first = dataclasses.replace(entry(0, 0, 0, 400), dimensions=(("m", 3),))
    second = dataclasses.replace(entry(0, 1, 400, 900), dimensions=(("m", 5),))
    older = entry(0, 2, 900, 950)  # before the pipeline enriched: nothing recorded
    head = History([first, second, older], {}, 0).head
    assert [d[2:4] + d[6:] for d in head.decisions(("m", "x"))] == [
        (0, 400, 3, None),
        (400, 900, 5, None),
        (900, 950, None, None),
    ]
    assert len(head.decisions()[0]) == 6


def test_a_backfill_that_joined_other_table_versions_rejudges_what_it_recomputed() -> None:
    import dataclasses

    first = dataclasses.replace(entry(0, 0, 0, 400), dimensions=(("m", 3),))
    second = dataclasses.replace(entry(0, 1, 400, 900), dimensions=(("m", 5),))
    # A backfill from batch 0's boundary joined version 7 (--dimensions newest).
    steps = {1: Step("publish", (0, 0), dimensions=(("m", 7),))}
    head = History([first, second], steps, 1).head
    assert [d[2:4] + d[6:] for d in head.decisions(("m",))] == [(0, 400, 3), (400, 900, 7)]


def test_a_replay_joins_what_the_offsets_first_batches_recorded() -> None:
    import dataclasses

    first = dataclasses.replace(entry(0, 0, 0, 400), dimensions=(("m", 3),))
    second = dataclasses.replace(entry(0, 1, 400, 900), dimensions=(("m", 5),))
    # A rewind that reprocesses from batch 0's end: epoch 1 restores that boundary.
    steps = {1: Step("restore", (0, 0))}
    history = History([first, second], steps, 1)
    assert history.head.read_on_from() == {P: 400}
    decided = history.replay_decisions({P: 400}, ("m",))
    # The discarded range keeps the version batch 1 joined; nothing before the cut.
    assert [d[2:4] + d[6:] for d in decided] == [(400, 900, 5)]

    # The replay's batch joined version 8 for what was new to it, and recorded the
    # piece it replayed with 5: the head says 5 there, 8 beyond.
    replay = dataclasses.replace(
        entry(1, 0, 400, 1000), dimensions=(("m", 8),), replayed=((P, 400, 900, (("m", 5),)),)
    )
    history = History([first, second, replay], steps, 1)
    assert [d[2:4] + d[6:] for d in history.head.decisions(("m",))] == [
        (0, 400, 3),
        (400, 900, 5),
        (900, 1000, 8),
    ]
    # A plain restart reads on from the head: nothing to replay.
    assert history.replay_decisions(history.head.read_on_from(), ("m",)) == []


def test_a_replay_after_a_backfill_with_newer_versions_joins_those() -> None:
    import dataclasses

    first = dataclasses.replace(entry(0, 0, 0, 400), dimensions=(("m", 3),))
    second = dataclasses.replace(entry(0, 1, 400, 900), dimensions=(("m", 5),))
    # A backfill --dimensions newest (version 7) of everything after batch 0, then a
    # rebuild from the source (state emptied): the replay joins 3, then 7.
    steps = {1: Step("publish", (0, 0), dimensions=(("m", 7),)), 2: Step("empty", None)}
    history = History([first, second], steps, 2)
    assert [d[2:4] + d[6:] for d in history.replay_decisions({}, ("m",))] == [
        (0, 400, 3),
        (400, 900, 7),
    ]
    # The same backfill, then a rewind to batch 0 (the state there is version 3's):
    # the discarded range keeps the backfill's 7, the latest judgment of it.
    steps = {1: Step("publish", (0, 0), dimensions=(("m", 7),)), 2: Step("restore", (0, 0))}
    decided = History([first, second], steps, 2).replay_decisions({P: 400}, ("m",))
    assert [d[2:4] + d[6:] for d in decided] == [(400, 900, 7)]


def test_the_ledger_reads_the_replayed_pieces_back() -> None:
    from jobs.ledger import batch_entries

    row = batch(1, 0, 400, 1000) | {
        "watermark_ms": 0,
        "commit_time": None,
        "delta_versions": "{}",
        "details": json.dumps(
            {
                "batch_timestamp_ms": 5,
                "dimensions": {"m": 8},
                "replayed": [[T, 0, 400, 900, {"m": 5}]],
            }
        ),
    }
    (found,) = batch_entries([row])
    # Rows from before tables were pinned by identity: the version alone.
    assert found.replayed == ((P, 400, 900, (("m", Pin(5)),)),)
    assert found.dimensions == (("m", Pin(8)),)


def test_the_ledger_reads_pinned_tables_back_with_their_identity() -> None:
    from jobs.ledger import batch_entries

    eight = {"version": 8, "id": "a1", "path": "/w/dims/m"}
    five = {"version": 5, "id": "b2", "path": "/w/dims/old m"}
    row = batch(1, 0, 400, 1000) | {
        "watermark_ms": 0,
        "commit_time": None,
        "delta_versions": "{}",
        "details": json.dumps(
            {
                "batch_timestamp_ms": 5,
                "dimensions": {"m": eight, "n": None},
                "replayed": [[T, 0, 400, 900, {"m": five, "n": None}]],
            }
        ),
    }
    (found,) = batch_entries([row])
    assert found.dimensions == (("m", Pin(8, "a1", "/w/dims/m")), ("n", None))
    assert found.replayed == ((P, 400, 900, (("m", Pin(5, "b2", "/w/dims/old m")), ("n", None))),)
    assert Pin.of(Pin(8, "a1", "/w/dims/m").to_json()) == Pin(8, "a1", "/w/dims/m")


def test_a_recomputation_asks_only_for_the_judgments_of_what_it_reads() -> None:
    # A backfill of the recent range must not need (or check) the table versions
    # that older batches joined: those may have been vacuumed.
    import dataclasses

    first = dataclasses.replace(entry(0, 0, 0, 400), dimensions=(("m", 3),))
    second = dataclasses.replace(entry(0, 1, 400, 900), dimensions=(("m", 5),))
    head = History([first, second], {}, 0).head
    recent = head.decisions(("m",), within={P: [(500, 900)]})
    assert [d[2:4] + d[6:] for d in recent] == [(400, 900, 5)]
    assert head.decisions(("m",), within={}) == []
    assert len(head.decisions(("m",))) == 2


def test_a_rebuild_from_the_source_after_a_rewind_reproduces_the_state_it_replaces() -> None:
    import dataclasses

    first = dataclasses.replace(entry(0, 0, 0, 400), dimensions=(("m", 3),))
    second = dataclasses.replace(entry(0, 1, 400, 900), dimensions=(("m", 5),))
    # A backfill --dimensions newest (7) of everything, then a rewind to batch 0's
    # end: the state there is what batch 0 made (3). A rebuild from the source then
    # replays 0..400 with 3, the state's, not the backfill's 7 the rewind undid.
    steps = {
        1: Step("publish", None, dimensions=(("m", 7),)),
        2: Step("restore", (0, 0)),
        3: Step("empty", None),
    }
    decided = History([first, second], steps, 3).replay_decisions({}, ("m",))
    assert [d[2:4] + d[6:] for d in decided] == [(0, 400, 3), (400, 900, 7)]


def test_a_run_replays_the_last_batch_only_when_spark_did_not_commit_it() -> None:
    # Spark runs its last batch again when it died between the ledger row and its
    # own commit: that batch then joins what it recorded; once Spark committed it,
    # the replay starts after it (a table reloaded since does not stop the run).
    batches = [entry(0, 0, 0, 400), entry(0, 1, 400, 900)]
    history = History(batches, {}, 0)
    assert history.replay_from({P: 0}) == {P: 400}
    assert history.replay_from({P: 0}, spark_committed=0) == {P: 400}
    assert history.replay_from({P: 0}, spark_committed=1) == {P: 900}
    assert History([], {}, 0).replay_from({P: 7}, spark_committed=3) == {P: 7}
