"""Random sequences of operations against a plain-Python model (issue 28).

The model keeps, per partition, the set of offsets the state judged and the set a
skip left out, and the lineage as a list of points (what the state held and where
the stream stood). The system under test is ``jobs.lineage`` fed with the ledger
entries the platform writes (batch rows, operations' steps and cuts) and its own
choices (``History.latest_before``, ``Coverage.excluding``). After every step the
two agree on what is judged, what is skipped and where the stream reads next;
Hypothesis shrinks a failing sequence to a minimal one.

A topic deleted and recreated makes every epoch so far read a log that is gone
(``excluded``); the repair keeps the state and reads the new log from 0, and is
the floor every later recomputation from the first offsets starts from.

An enrichment's table changes between batches (issue 29): each batch joins the
table's version of its time for offsets new to it, and for an offset judged
before the version the lineage last held for it (a replay reproduces it), which
the batch records (``replayed``); a backfill with the newest version rejudges
what it recomputes. The model keeps the table (a ``Pin``: id, location,
version) of each offset the state judged, and the one the lineage last held for
each offset ever judged (issue 42).

Watermarks (issue 45): a batch is judged by the stream's watermark and leaves a
watermark at least as high (its records' event times move it on), which its ledger
row records. Every point of the lineage holds the watermark the stream had reached
there, and a new epoch's floor (``operations/apply.watermark_floor``: a restored
boundary's, the head's for a backfill, none for emptied state) is the model's.

The tables change under the stream as users change them: a new version loaded,
a table deleted and loaded again at its location (another table id: the pins of
the old one can no longer be read, and every replay or recomputation that needs
one is refused until ``backfill --dimensions newest``), ``enrich`` re-pointed to
another table, and pipeline versions that remove or add ``enrich:`` or change a
derived column. Each batch joins the table the pipeline points at then; a replay
joins what the lineage last held (a range judged without the enrichment: the
table it points at now).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from jobs.lineage import TP, BatchEntry, Boundary, History, Intervals, Pin, Step
from jobs.streaming.table_versions import merged, pieces

T = "t"


def as_intervals(offsets: dict[TP, set[int]]) -> Intervals:
    out: Intervals = {}
    for tp, found in offsets.items():
        spans: list[tuple[int, int]] = []
        for o in sorted(found):
            if spans and spans[-1][1] == o:
                spans[-1] = (spans[-1][0], o + 1)
            else:
                spans.append((o, o + 1))
        if spans:
            out[tp] = spans
    return out


@dataclass
class Point:
    """The model's lineage point: what the state held and where the stream stood."""

    judged: dict[TP, set[int]]
    skipped: dict[TP, set[int]]
    pos: dict[TP, int]
    versions: dict[TP, dict[int, Pin | None]]  # the table each judged offset joined
    watermark: int = 0  # the watermark the stream had reached

    def copy(self) -> Point:
        return Point(
            {tp: set(s) for tp, s in self.judged.items()},
            {tp: set(s) for tp, s in self.skipped.items()},
            dict(self.pos),
            {tp: dict(v) for tp, v in self.versions.items()},
            self.watermark,
        )

    def fits(self, target: dict[TP, int]) -> bool:
        """Nothing judged at or after the target, and anything between the target
        and where the stream stood was skipped."""
        return all(
            all(o in self.skipped.get(tp, set()) for o in range(target[tp], pos))
            for tp, pos in self.pos.items()
            if tp in target
        )


class Repairs(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.log: dict[TP, int] = {(T, 0): 0}  # records produced per partition
        # The model.
        self.model = Point({}, {}, {(T, 0): 0}, {})
        # The dimension tables by location: (table id, newest version); the one the
        # pipeline's enrich points at (None: a version without enrich:).
        self.tables: dict[str, tuple[str, int]] = {"a": ("a0", 0), "b": ("b0", 0)}
        self.pointing: str | None = "a"
        self.gone: set[Pin] = set()  # pins whose table was deleted and loaded again
        self.definition = 1  # the pipeline version
        self.recorded: dict[TP, dict[int, Pin | None]] = {}  # what the lineage last held
        self.points: list[Point] = []  # the first cut has no state version to restore
        # What the platform writes: ledger rows, steps, cuts; where its stream reads.
        self.epoch = 0
        self.batch_id = 0
        self.version = 0
        self.batches: list[BatchEntry] = []
        self.steps: dict[int, Step] = {}
        self.cuts: dict[int, tuple[dict[TP, int], int]] = {}
        self.reads: dict[TP, int] = {(T, 0): 0}
        self.cut: dict[TP, int] = {(T, 0): 0}  # where the epoch began
        self.excluded: set[int] = set()  # epochs that read a deleted log
        self.floor: int | None = None  # the epoch of the repair that kept their state
        self.floor_watermark = 0  # the model's watermark at that repair
        self.watermark = 0  # the platform's: what the epoch's next batch is judged by

    # -- the system under test ------------------------------------------------
    def history(self) -> History:
        return History(self.batches, self.steps, self.epoch, frozenset(self.excluded))

    def boundaries(self, history: History) -> list[Boundary]:
        return history.boundaries(self.cuts)

    def floor_of(self, step: Step, boundary: Boundary | None) -> int:
        """The new epoch's watermark floor as ``operations/apply.watermark_floor``
        takes it: from the plan's ``boundary``, or the lineage before the operation."""
        history = self.history()
        if step.action == "publish":
            return history.head.watermark_ms
        if step.action == "empty" or step.boundary is None:
            return 0
        if boundary is None:
            found = [b for b in self.boundaries(history) if (b.epoch, b.batch_id) == step.boundary]
            boundary = found[0]
        return boundary.watermark_ms

    def begin_epoch(
        self, step: Step | None, reads: dict[TP, int], boundary: Boundary | None = None
    ) -> None:
        floor = self.watermark if step is None else self.floor_of(step, boundary)
        self.epoch += 1
        self.batch_id = 0
        if step is not None:
            self.version += 1
            # The done row's plan holds its boundary, with the watermark it reached.
            held = floor if step.action in ("keep", "restore") else 0
            self.steps[self.epoch] = Step(
                step.action,
                step.boundary,
                step.skipped,
                state_version=self.version,
                watermark_ms=held,
            )
            self.cuts[self.epoch] = (dict(reads), floor)
        self.reads = dict(reads)
        self.cut = dict(reads)
        self.watermark = floor

    def chosen(self, target: dict[TP, int]) -> tuple[Boundary | None, Point | None]:
        history = self.history()
        found = history.latest_before(self.boundaries(history), target)
        fits = [p for p in self.points if p.fits(target)]
        return found, (fits[-1] if fits else None)

    # -- rules ------------------------------------------------------------------
    @rule(part=st.integers(0, 3), n=st.integers(1, 30))
    def produce(self, part: int, n: int) -> None:
        tp = (T, part % len(self.log))
        self.log[tp] += n

    @precondition(lambda self: len(self.log) < 4)
    @rule()
    def add_partition(self) -> None:
        self.log[(T, len(self.log))] = 0

    def pin(self) -> Pin | None:
        """The table a batch joins now (None: the pipeline has no enrich:)."""
        if self.pointing is None:
            return None
        table_id, version = self.tables[self.pointing]
        return Pin(version, table_id, self.pointing)

    @rule(table=st.sampled_from(["a", "b"]))
    def load_dimension(self, table: str) -> None:
        """A new version of a table loaded (``python -m jobs dimension``)."""
        table_id, version = self.tables[table]
        self.tables[table] = (table_id, version + 1)

    @rule(table=st.sampled_from(["a", "b"]))
    def delete_and_reload_dimension(self, table: str) -> None:
        """The table deleted and loaded again at its location: another table id, from
        version 0; what batches joined of the old one can no longer be read."""
        table_id, version = self.tables[table]
        self.gone |= {Pin(v, table_id, table) for v in range(version + 1)}
        self.tables[table] = (f"{table}{int(table_id[1:]) + 1}", 0)

    @rule(table=st.sampled_from(["a", "b", None]), derived=st.booleans())
    def new_pipeline_version(self, table: str | None, derived: bool) -> None:
        """A new definition: enrich re-pointed to another table, removed (None) or
        added, or (``derived``) a derived column changed, which changes what the
        state means but not what it covers."""
        self.definition += 1
        self.pointing = table

    @rule(most=st.integers(1, 40), advance=st.integers(0, 3))
    def run(self, most: int, advance: int) -> None:
        """One batch of at most ``most`` records per partition; a new partition is
        read from offset 0 (``offset_log.batch_start``). Its records move the
        watermark on by ``advance``."""
        start = {tp: self.reads.get(tp, 0) for tp in self.log}
        end = {tp: min(self.log[tp], start[tp] + most) for tp in self.log}
        if all(end[tp] == start[tp] for tp in self.log):
            return  # Spark runs no batch when nothing is new
        if self.pointing is not None and any(r[6] in self.gone for r in self.ahead()):
            return  # refused with one line (every range ahead is checked): backfill first
        replayed = self.replayed(start, end)
        self.version += 1
        pin = self.pin()
        self.batches.append(
            BatchEntry(
                self.epoch,
                self.batch_id,
                start,
                end,
                watermark_ms=self.watermark,
                reached_ms=self.watermark + advance,
                state_version=self.version,
                dimensions=() if pin is None else (("m", pin),),
                replayed=replayed,
            )
        )
        # Killed after its ledger row, before Spark's commit: Spark runs it again (with
        # the version its checkpoint recorded), and joins what its first run joined.
        first = self.joined(replayed, start, end)
        assert self.joined(self.replayed(start, end), start, end) == first
        self.batch_id += 1
        self.reads = end
        self.watermark += advance
        self.model.watermark += advance
        for tp in self.log:
            self.model.judged.setdefault(tp, set()).update(range(start[tp], end[tp]))
            self.model.pos[tp] = end[tp]
            recorded = self.recorded.setdefault(tp, {})
            for o in range(start[tp], end[tp]):
                # Judged before: what the lineage held (a range judged without the
                # enrichment: the table now); without enrich: nothing joined.
                held = recorded.get(o)
                recorded[o] = None if pin is None else pin if held is None else held
                self.model.versions.setdefault(tp, {})[o] = recorded[o]
        self.points.append(self.model.copy())

    def replayed(self, start: dict[TP, int], end: dict[TP, int]) -> tuple[object, ...]:
        """What a run joins where it replays (``jobs/streaming/dimensions.replay_ranges``),
        as a batch [start, end) records it: nothing without enrich:, and a range
        judged without the enrichment joins the table now (``joined_versions``)."""
        if self.pointing is None:
            return ()
        ranges = merged(self.ahead(), 1)
        return tuple(
            (tp, begin, stop, tuple(sorted(versions.items())))
            for topic, part, begin, stop, versions in pieces(ranges, ["m"], start, end)
            for tp in [(topic, part)]
        )

    def ahead(self) -> list[tuple[object, ...]]:
        """The ranges a run replays (``dimensions.replay_ranges``), a range judged
        without the enrichment with the table now (``joined_versions``)."""
        history = self.history()
        decisions = history.replay_decisions(history.replay_from(self.cut), ("m",))
        return [(*d[:6], self.pin() if d[6] is None else d[6]) for d in decisions]

    def joined(
        self, replayed: tuple[object, ...], start: dict[TP, int], end: dict[TP, int]
    ) -> dict[tuple[TP, int], Pin | None]:
        """The table each offset of a batch joins: its replayed piece's, else the
        batch's own (the table's now)."""
        found = {(tp, o): self.pin() for tp in end for o in range(start[tp], end[tp])}
        for tp, begin, stop, versions in replayed:  # type: ignore[misc]
            for o in range(begin, stop):
                found[(tp, o)] = dict(versions)["m"]
        return found

    def needs_gone(self, since: dict[TP, int] | None, reads: Intervals | None = None) -> bool:
        """Whether a replay from ``since`` (None: the first offsets), or a
        recomputation of ``reads`` with the recorded tables, needs a table that was
        deleted and loaded again (the planner refuses it). The planner asks for at
        least every table the model says those offsets joined."""
        if self.pointing is None:
            return False  # a pipeline without enrich: joins nothing
        history = self.history()
        if reads is None:
            start = since or {}
            decisions = history.replay_decisions(start, ("m",))
            model = {
                pin
                for tp, held in self.recorded.items()
                for o, pin in held.items()
                if o >= start.get(tp, 0)
            }
        else:
            decisions = history.head.decisions(("m",), reads)
            model = {
                self.model.versions.get(tp, {}).get(o)
                for tp, spans in reads.items()
                for begin, end in spans
                for o in range(begin, end)
            }
        planned = {d[6] for d in decisions if d[6] is not None}
        assert model - {None} <= planned, (model, planned)
        return bool(planned & self.gone)

    @rule()
    def crash_an_operation_after_its_fence(self) -> None:
        """An operation that bumped the epoch and died: no step; the state goes on."""
        self.begin_epoch(None, self.reads)

    @precondition(lambda self: self.batches)
    @rule()
    def rebuild(self) -> None:
        head = self.boundaries(self.history())[-1]
        self.begin_epoch(Step("keep", (head.epoch, head.batch_id)), head.end_offsets)
        self.points.append(self.model.copy())

    @rule()
    def rebuild_from_source(self) -> None:
        """From the first offsets: emptied state, or (a topic recreated) the state
        the repair kept, from the new log's first offsets."""
        if self.needs_gone(None):
            return  # refused with one line: backfill --dimensions newest first
        if self.floor is None:
            self.begin_epoch(Step("empty", None), {tp: 0 for tp in self.log})
        else:
            self.begin_epoch(Step("restore", (self.floor, -1)), {tp: 0 for tp in self.log})
        watermark = 0 if self.floor is None else self.floor_watermark
        self.model = Point({}, {}, {tp: 0 for tp in self.log}, {}, watermark)
        self.points = [self.model.copy()]

    @precondition(lambda self: self.batches)
    @rule(parts=st.integers(1, 3))
    def recreate_topic(self, parts: int) -> None:
        """The topic deleted and recreated with ``parts`` partitions, and repaired:
        the state kept, the new log read from 0."""
        head = self.boundaries(self.history())[-1]  # the plan's, before the topic went
        self.excluded |= set(range(self.epoch + 1))
        self.log = {(T, p): 0 for p in range(parts)}
        reads = {tp: 0 for tp in self.log}
        self.begin_epoch(Step("keep", (head.epoch, head.batch_id)), reads, head)
        self.floor = self.epoch
        self.floor_watermark = self.model.watermark  # the state kept, its windows too
        self.model = Point({}, {}, dict(reads), {}, self.model.watermark)
        self.points = [self.model.copy()]
        self.recorded = {}  # the deleted log's records are not the new log's

    @precondition(lambda self: self.batches)
    @rule(data=st.data())
    def skip(self, data: st.DataObject) -> None:
        head = self.boundaries(self.history())[-1]
        target = {
            tp: data.draw(st.integers(self.reads.get(tp, 0), self.log[tp])) for tp in self.log
        }
        skipped = {
            tp: (self.reads.get(tp, 0), off)
            for tp, off in target.items()
            if off > self.reads.get(tp, 0)
        }
        self.begin_epoch(Step("keep", (head.epoch, head.batch_id), skipped), target)
        for tp, (begin, end) in skipped.items():
            self.model.skipped.setdefault(tp, set()).update(range(begin, end))
        self.model.pos = dict(target)
        self.points.append(self.model.copy())

    @precondition(lambda self: self.batches)
    @rule(data=st.data())
    def reprocess(self, data: st.DataObject) -> None:
        target = {tp: data.draw(st.integers(0, self.log[tp])) for tp in self.log}
        found, point = self.chosen(target)
        assert (found is None) == (point is None), (found, point)
        if found is None or point is None:
            self.rebuild_from_source()  # no point before the target: replay from the start
            return
        # (A partition the boundary does not name, added after it, starts at 0.)
        assert set(found.end_offsets) <= set(point.pos)
        assert {tp: found.end_offsets.get(tp, 0) for tp in point.pos} == point.pos
        if self.needs_gone(found.end_offsets):
            return  # refused with one line (``replay_notes``): backfill --dimensions newest
        self.begin_epoch(Step("restore", (found.epoch, found.batch_id)), found.end_offsets)
        self.model = point.copy()
        for tp, versions in point.versions.items():  # the lineage holds these again
            self.recorded.setdefault(tp, {}).update(versions)
        self.points = self.points[: self.points.index(point) + 1] + [self.model.copy()]

    @precondition(lambda self: self.batches)
    @rule(data=st.data(), earliest=st.booleans(), newest=st.booleans())
    def backfill(self, data: st.DataObject, earliest: bool, newest: bool) -> None:
        history = self.history()
        head = history.head
        if earliest and self.floor is not None:  # from the floor: its state stays
            found = next(b for b in self.boundaries(history) if b.epoch == self.floor)
            point = self.points[0]
        elif earliest:
            found, point = None, None
        else:
            target = {tp: data.draw(st.integers(0, self.log[tp])) for tp in self.log}
            found, point = self.chosen(target)
        reads = head.judged() if found is None else head.excluding(history.coverage_at(found))
        base = {} if point is None else point.judged
        expected = {tp: judged - base.get(tp, set()) for tp, judged in self.model.judged.items()}
        assert reads == as_intervals(expected)
        boundary = None if found is None else (found.epoch, found.batch_id)
        if self.pointing is None:
            newest = False  # no enrich: nothing to join
        elif not newest and self.needs_gone(None if found is None else found.end_offsets, reads):
            return  # refused with one line (``check_readable``): the newest is the repair
        if newest:  # a fix of the table, then a backfill with it
            self.load_dimension(self.pointing)  # type: ignore[arg-type]
        pin = self.pin()
        chosen = (("m", pin),) if newest and pin is not None else ()
        self.begin_epoch(Step("publish", boundary), self.reads)
        self.steps[self.epoch] = replace(self.steps[self.epoch], dimensions=chosen)
        assert self.history().recomputed(self.epoch) == reads  # its dead letters' ranges
        assert self.history().head.judged() == head.judged()  # a backfill changes no coverage
        if newest:  # what it recomputed stands judged with the newest version
            for tp, offsets in expected.items():
                for o in offsets:
                    self.model.versions.setdefault(tp, {})[o] = pin
            # and so does what a rewind discarded after its boundary (still to replay)
            for tp, recorded in self.recorded.items():
                for o in recorded:
                    if o not in base.get(tp, set()):
                        recorded[o] = pin
        kept = [] if point is None else self.points[: self.points.index(point) + 1]
        self.points = [*kept, self.model.copy()]

    # -- what must always hold --------------------------------------------------
    @invariant()
    def the_coverage_is_the_models(self) -> None:
        head = self.history().head
        assert head.judged() == as_intervals(self.model.judged)
        assert head.gaps() == as_intervals(
            {tp: s - self.model.judged.get(tp, set()) for tp, s in self.model.skipped.items()}
        )
        for spans in head.spans.values():  # every offset judged once: disjoint spans
            assert all(a.end <= b.begin for a, b in itertools.pairwise(spans))

    @invariant()
    def each_judged_offset_carries_the_version_the_state_joined(self) -> None:
        for topic, part, begin, end, *rest in self.history().head.decisions(("m",)):
            versions = self.model.versions.get((topic, part), {})
            found = {versions.get(o) for o in range(begin, end)}
            assert found == {rest[-1]}, ((topic, part, begin, end), rest[-1], found)

    @invariant()
    def each_judged_record_has_one_standing_judgment(self) -> None:
        """Where a record's dead letter is (``jobs/superseded.py``): a standing batch's
        (``History.standing``) or a standing backfill's (what it judged again,
        ``History.recomputed``), whichever is later. Every judged offset of the
        current log has exactly one, and nothing beyond what the state judged has any."""
        history = self.history()
        standing = history.standing()
        judges: dict[tuple[TP, int], list[int]] = {}  # the epochs that judged it
        for b in self.batches:
            last = standing.get(b.epoch, -1)
            if b.epoch in self.excluded or (last is not None and b.batch_id > last):
                continue
            for tp, end in b.end.items():
                for o in range(b.start.get(tp, 0), end):
                    judges.setdefault((tp, o), []).append(b.epoch)
        for epoch, step in self.steps.items():
            if step.action == "publish" and epoch in standing and epoch not in self.excluded:
                for tp, spans in history.recomputed(epoch).items():
                    for begin, end in spans:
                        for o in range(begin, end):
                            judges.setdefault((tp, o), []).append(epoch)
        # Rows a later backfill judged again are removed; a batch's and its own
        # epoch's backfill never judge one record both (the backfill came first).
        kept = {place: sum(1 for e in es if e == max(es)) for place, es in judges.items()}
        judged = {(tp, o): 1 for tp, offsets in self.model.judged.items() for o in offsets}
        assert kept == judged

    @invariant()
    def the_stream_is_judged_by_the_models_watermark(self) -> None:
        assert self.watermark == self.model.watermark

    @invariant()
    def recomputations_start_from_the_floor(self) -> None:
        assert self.history().floor == self.floor

    @invariant()
    def no_record_is_both_judged_and_skipped(self) -> None:
        for tp, judged in self.model.judged.items():
            assert not judged & self.model.skipped.get(tp, set())

    @invariant()
    def the_stream_reads_on_where_the_model_does(self) -> None:
        for tp, pos in self.model.pos.items():
            assert self.reads.get(tp, 0) == pos, (tp, self.reads, self.model.pos)


Repairs.TestCase.settings = settings(
    max_examples=2000, stateful_step_count=20, deadline=None, database=None, derandomize=True
)
test_repairs_in_any_order = Repairs.TestCase
