"""What the state covers: per topic-partition, the offset intervals its records were
judged in and what judged each (a batch, with its watermark and batch time), with
the ranges a skip left out as explicit gaps. The one owner of the application's
lineage: every planner, ``verify``, ``status`` and ``maintain`` read it from here.

Pure: built from the ledger's batch rows and the operations' "done" rows, no Spark,
no broker. How each epoch begins (its operation's plan, ``Step``):

- no operation (the first epoch, a fence's, one whose operation died): the coverage
  the previous epoch ended with;
- ``keep`` (rebuild, rewind skip): the coverage at the plan's boundary, plus the
  skip's ranges as gaps;
- ``restore`` (rewind reprocess): the coverage at the boundary;
- ``empty`` (rebuild from source, a rewind before the first batch): nothing;
- ``publish`` (backfill): what the previous epoch ended with. A backfill recomputes
  exactly the judged intervals with their own judgments: it changes the code the
  state was computed with, not which records it holds.

Each batch then adds its [start, end) per partition (a partition that appeared
mid-epoch from its first offset). "Judged exactly once" is interval arithmetic.
"""

from __future__ import annotations

from collections.abc import Iterable, Set
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

TP = tuple[str, int]
Offsets = dict[TP, int]
Intervals = dict[TP, list[tuple[int, int]]]  # merged [begin, end) per partition


@dataclass(frozen=True, order=True)
class Pin:
    """A dimension table as a batch joined it: its version, and which table that was
    (Delta's table id, ``metaData.id``, and its location). Rows recorded before the
    id and location were have them empty: the enrichment's current table, unchecked."""

    version: int
    table_id: str = ""
    path: str = ""

    @staticmethod
    def of(value: object) -> Pin | None:
        """A pin as the ledger and plans hold it: {"version", "id", "path"}, or a
        bare version (rows from before identity was recorded)."""
        if value is None:
            return None
        if isinstance(value, dict):
            return Pin(
                int(value["version"]), str(value.get("id") or ""), str(value.get("path") or "")
            )
        if isinstance(value, Pin):
            return value
        if isinstance(value, int | float):
            return Pin(int(value))
        return Pin(int(str(value)))

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "id": self.table_id, "path": self.path}


def pins_text(pins: Set[Pin], path: str) -> str:
    """``pins`` for a plan's note: the versions, and where a table is not the
    enrichment's now (``path``), which table."""
    return ", ".join(
        str(p.version) if p.path in ("", path) else f"{p.version} of {p.path}" for p in sorted(pins)
    )


class Judged(StrEnum):
    BATCH = "batch"
    SKIP = "skip"  # a gap: no record in it reached the state


@dataclass(frozen=True)
class Judge:
    kind: Judged
    epoch: int
    batch_id: int = -1
    watermark_ms: int = 0
    batch_time_ms: int = 0
    # The table each enrichment's join read, as (name, pin; None: no record to join).
    dimensions: tuple[tuple[str, Pin | None], ...] = ()
    reached_ms: int = 0  # the watermark the batch left behind (``BatchEntry``)

    @property
    def reached(self) -> int:
        return max(self.watermark_ms, self.reached_ms)


@dataclass(frozen=True)
class Span:
    begin: int
    end: int
    judge: Judge


@dataclass(frozen=True)
class Coverage:
    spans: dict[TP, tuple[Span, ...]] = field(default_factory=dict)  # sorted, disjoint
    watermark_ms: int = 0  # the highest watermark the batches it holds reached

    def judged(self) -> Intervals:
        """The offsets whose records the state reflects (gaps left out), merged."""
        return _merged(
            {
                tp: [(s.begin, s.end) for s in spans if s.judge.kind is Judged.BATCH]
                for tp, spans in self.spans.items()
            }
        )

    def gaps(self) -> Intervals:
        return _merged(
            {
                tp: [(s.begin, s.end) for s in spans if s.judge.kind is Judged.SKIP]
                for tp, spans in self.spans.items()
            }
        )

    def judged_end(self) -> Offsets:
        """Per partition, the end of the last judged interval."""
        return {tp: spans[-1][1] for tp, spans in self.judged().items()}

    def records(self) -> int:
        return sum(e - b for spans in self.judged().values() for b, e in spans)

    def decisions(
        self, dimensions: tuple[str, ...] = (), within: Intervals | None = None
    ) -> list[tuple[Any, ...]]:
        """(topic, partition, begin, end, watermark_ms, batch_time_ms, and the version
        of each of ``dimensions`` the batch joined, or None) of every judged span (that
        overlaps ``within``, what a recomputation reads): how a recomputation judges
        each record as the stream did."""
        return sorted(
            (
                tp[0],
                tp[1],
                s.begin,
                s.end,
                s.judge.watermark_ms,
                s.judge.batch_time_ms,
                *(dict(s.judge.dimensions).get(name) for name in dimensions),
            )
            for tp, spans in self.spans.items()
            for s in spans
            if s.judge.kind is Judged.BATCH
            and (within is None or any(b < s.end and s.begin < e for b, e in within.get(tp, [])))
        )

    def batch_judgments(self) -> list[tuple[Offsets, Offsets, Judge]]:
        """Its judged spans as ``adding`` takes them (to overlay them on another)."""
        return [
            ({tp: s.begin}, {tp: s.end}, s.judge)
            for tp, spans in self.spans.items()
            for s in spans
            if s.judge.kind is Judged.BATCH
        ]

    def read_on_from(self) -> Offsets:
        """Per partition, where a stream continuing from this coverage reads on: the
        end of its last span, judged or skipped."""
        return {tp: spans[-1].end for tp, spans in self.spans.items() if spans}

    def adding(self, batches: Iterable[tuple[Offsets, Offsets, Judge]]) -> Coverage:
        """With each [start, end) per partition judged by its judge, in order: a later
        judgment of an offset replaces an earlier one (never both)."""
        spans = {tp: list(s) for tp, s in self.spans.items()}
        watermark = self.watermark_ms
        for start, end, judge in batches:
            for tp, stop in end.items():
                begin = start.get(tp, stop)
                if stop <= begin:
                    continue
                have = spans.setdefault(tp, [])
                new = Span(begin, stop, judge)
                if not have or have[-1].end <= begin:
                    have.append(new)  # the common case: a batch reads on from the last
                else:
                    have[:] = _overlaid(have, new)
            if judge.kind is Judged.BATCH:
                watermark = max(watermark, judge.reached)
        return Coverage({tp: tuple(s) for tp, s in spans.items() if s}, watermark)

    def gaps_since(self, other: Coverage) -> Intervals:
        """The gaps here that ``other`` does not have: what a recomputation from
        ``other``'s state reads (and judges) though a skip left it out."""
        mine, theirs = self.gaps(), other.gaps()
        return _merged({tp: _minus(spans, theirs.get(tp, [])) for tp, spans in mine.items()})

    def rejudged(self, dimensions: dict[str, Pin], kept: Coverage) -> Coverage:
        """The judged spans not in ``kept`` with ``dimensions``' versions (a backfill
        that joined other table versions than the batches recorded)."""
        unchanged = {(tp, s) for tp, spans in kept.spans.items() for s in spans}
        spans = {
            tp: tuple(
                s
                if s.judge.kind is not Judged.BATCH or (tp, s) in unchanged
                else replace(
                    s,
                    judge=replace(
                        s.judge,
                        dimensions=tuple(sorted((dict(s.judge.dimensions) | dimensions).items())),
                    ),
                )
                for s in found
            )
            for tp, found in self.spans.items()
        }
        return Coverage(spans, self.watermark_ms)

    def excluding(self, other: Coverage) -> Intervals:
        """Judged here and not in ``other`` (what a recomputation from ``other``'s
        state reads)."""
        return subtract(self.judged(), other.judged())


def _overlaid(spans: list[Span], new: Span) -> list[Span]:
    kept: list[Span] = []
    for s in spans:
        if s.begin < new.begin:
            kept.append(replace(s, end=min(s.end, new.begin)))
        if s.end > new.end:
            kept.append(replace(s, begin=max(s.begin, new.end)))
    kept.append(new)
    return sorted((s for s in kept if s.end > s.begin), key=lambda s: s.begin)


def _merged(intervals: Intervals) -> Intervals:
    out: Intervals = {}
    for tp, spans in intervals.items():
        merged: list[tuple[int, int]] = []
        for begin, end in sorted(s for s in spans if s[1] > s[0]):
            if merged and begin <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], end))
            else:
                merged.append((begin, end))
        if merged:
            out[tp] = merged
    return out


def subtract(intervals: Intervals, holes: Intervals) -> Intervals:
    """The offsets of ``intervals`` that are not in ``holes``."""
    return _merged({tp: _minus(spans, holes.get(tp, [])) for tp, spans in intervals.items()})


def _minus(spans: list[tuple[int, int]], holes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out = []
    for begin, end in spans:
        pieces = [(begin, end)]
        for hb, he in holes:
            pieces = [
                p for b, e in pieces for p in ((b, min(e, hb)), (max(b, he), e)) if p[1] > p[0]
            ]
        out.extend(pieces)
    return out


def layers(intervals: Intervals) -> list[tuple[Offsets, Offsets]]:
    """Reads of one range per partition each (what the source takes), together
    covering every interval: the k-th interval of every partition in the k-th."""
    depth = max((len(spans) for spans in intervals.values()), default=0)
    reads = []
    for k in range(depth):
        start: Offsets = {}
        end: Offsets = {}
        for tp, spans in intervals.items():
            span = spans[k] if k < len(spans) else (spans[-1][1], spans[-1][1])
            start[tp], end[tp] = span
        reads.append((start, end))
    return reads


def partition_of(name: str) -> TP:
    """``topic[p]`` (a plan's name of a partition) as (topic, p)."""
    topic, _, part = name.rpartition("[")
    return topic, int(part.rstrip("]"))


def spelled(intervals: Intervals) -> str:
    """``topic[p] begin..last`` for each interval (a plan's note)."""
    return ", ".join(f"{k} {b}..{e - 1}" for k, spans in named(intervals).items() for b, e in spans)


def named(intervals: Intervals) -> dict[str, list[list[int]]]:
    """``topic[p]`` -> [[begin, end), ...] (a plan's JSON form)."""
    return {f"{t}[{p}]": [[b, e] for b, e in spans] for (t, p), spans in sorted(intervals.items())}


@dataclass(frozen=True)
class BatchEntry:
    """A committed batch as the ledger holds it."""

    epoch: int
    batch_id: int
    start: Offsets
    end: Offsets
    watermark_ms: int = 0  # the watermark it was judged by
    batch_time_ms: int = 0
    state_version: int | None = None  # the state version it left (None: not recorded)
    commit_time_us: int = 0
    dimensions: tuple[tuple[str, Pin | None], ...] = ()  # the enrichments' tables joined
    # Ranges it replayed that were judged before: the tables it joined there (the
    # earlier judgment's, not ``dimensions``), as (partition, begin, end, pins).
    replayed: tuple[tuple[TP, int, int, tuple[tuple[str, Pin | None], ...]], ...] = ()
    # The watermark it left behind: its own, moved on by its records' event times
    # (rows from before it was recorded: 0, its own).
    reached_ms: int = 0

    @property
    def reached(self) -> int:
        """The watermark the application had reached after it."""
        return max(self.watermark_ms, self.reached_ms)

    def judgments(self) -> list[tuple[Offsets, Offsets, Judge]]:
        """Its [start, end) with its judge, then each replayed piece with the versions
        the piece joined (a later judgment of an offset replaces an earlier one)."""
        judge = Judge(
            Judged.BATCH,
            self.epoch,
            self.batch_id,
            self.watermark_ms,
            self.batch_time_ms,
            self.dimensions,
            self.reached_ms,
        )
        pieces = [
            ({tp: begin}, {tp: end}, replace(judge, dimensions=versions))
            for tp, begin, end, versions in self.replayed
        ]
        return [(self.start, self.end, judge), *pieces]


@dataclass(frozen=True)
class Step:
    """How an epoch began: the operation's plan, as its "done" ledger row holds it."""

    action: str  # keep, restore, empty, publish
    boundary: tuple[int, int] | None  # (epoch, batch id) the state was taken at
    skipped: dict[TP, tuple[int, int]] = field(default_factory=dict)  # a skip's [from, to)
    state_version: int | None = None  # the state version it left
    done_us: int = 0  # when it recorded that it was done
    # The tables a backfill joined instead of the recorded ones (newest).
    dimensions: tuple[tuple[str, Pin], ...] = ()
    # The watermark its boundary had reached: the state taken there holds it, also
    # where the boundary's epoch read a deleted log (its batches count for nothing).
    watermark_ms: int = 0


@dataclass(frozen=True)
class Boundary:
    """A point of the lineage the state can be taken from: a committed batch's end
    (or an operation's cut, batch id -1), and the state version exact for it."""

    epoch: int
    batch_id: int
    end_offsets: Offsets
    state_version: int
    watermark_ms: int = 0
    commit_time_us: int = 0
    # The cut that moved the application onto a recreated topic's new log keeping
    # its state (``History.floor``): nothing before it can be restored or replayed.
    floor: bool = False


class History:
    """The application's epochs, replayed: the coverage every epoch began with, and
    the live lineage (the epochs and batches its state is still made of).

    ``excluded``: epochs that read a topic's deleted log (it was recreated since).
    Their offsets compare with nothing in the new log, so they cover nothing here.
    The operation that moved the application onto the new log keeping its state is
    the ``floor``: the state it kept holds the deleted log's judgments, which no
    broker can replay, so whatever recomputes from the first offsets starts there.
    """

    def __init__(
        self,
        batches: list[BatchEntry],
        steps: dict[int, Step],
        epoch: int,
        excluded: frozenset[int] = frozenset(),
    ) -> None:
        self.epoch = epoch
        self.steps = steps
        self.excluded = excluded
        self.batches: dict[int, list[BatchEntry]] = {}
        for b in sorted(batches, key=lambda b: (b.epoch, b.batch_id)):
            if b.epoch not in excluded:
                self.batches.setdefault(b.epoch, []).append(b)
        self.starts: dict[int, Coverage] = {}
        for at in range(epoch + 1):
            self.starts[at] = self._start(at)
        self.floor: int | None = None
        self.upto = self._chain()

    def _start(self, at: int) -> Coverage:
        step = self.steps.get(at)
        if at == 0 or at in self.excluded:
            return Coverage()
        if step is None or step.action == "publish":
            found = self.at(at - 1)
            if step is not None and step.dimensions:
                # What the backfill recomputed now stands judged with its versions.
                kept = Coverage() if step.boundary is None else self.at(*step.boundary)
                found = found.rejudged(dict(step.dimensions), kept)
            return found
        if step.action == "empty" or step.boundary is None:
            return Coverage()
        base = self.at(*step.boundary)
        base = replace(base, watermark_ms=max(base.watermark_ms, step.watermark_ms))
        if step.skipped:
            begin = {tp: r[0] for tp, r in step.skipped.items()}
            end = {tp: r[1] for tp, r in step.skipped.items()}
            base = base.adding([(begin, end, Judge(Judged.SKIP, at))])
        return base

    def at(self, epoch: int, batch_id: int | None = None) -> Coverage:
        """The coverage after ``epoch``'s batch ``batch_id`` (-1: as the epoch began;
        None: after its last batch)."""
        return self.starts.get(epoch, Coverage()).adding(
            judgment
            for b in self.batches.get(epoch, [])
            if batch_id is None or b.batch_id <= batch_id
            for judgment in b.judgments()
        )

    @property
    def head(self) -> Coverage:
        return self.at(self.epoch)

    def replay_from(self, cut: Offsets, spark_committed: int | None = None) -> Offsets:
        """Where a run's replayed ranges begin: the epoch's cut, or the start of its
        last batch in the ledger, which Spark runs again when it died before its own
        commit (the batch then joins what its ledger row recorded, so that Spark's
        state is what it was), or, when Spark's commit log holds that batch
        (``spark_committed``, its newest batch id), its end. Batches before it
        Spark does not run again."""
        batches = self.batches.get(self.epoch)
        if not batches:
            return dict(cut)
        last = batches[-1]
        edge = (
            last.end
            if spark_committed is not None and spark_committed >= last.batch_id
            else last.start
        )
        return {tp: max(cut.get(tp, 0), edge.get(tp, cut.get(tp, 0))) for tp in last.end}

    def replay_decisions(
        self, reading_from: Offsets, dimensions: tuple[str, ...]
    ) -> list[tuple[Any, ...]]:
        """``Coverage.decisions`` of the offsets at or after ``reading_from`` (where a
        stream reads on) that were judged before: what a replay through new batches
        (a rewind that reprocesses, a rebuild from the source) joins there. An offset
        keeps the judgment the lineage last held for it: each epoch's start (what its
        state was: a restored boundary, a backfill's rejudged ranges), then its
        batches, in order. So a replay joins the versions its first judgment
        recorded, those a backfill rejudged it with (a range a rewind discarded
        after the backfill's boundary too), or, where a rewind discarded it, those
        of the judgment discarded."""
        latest = Coverage()
        for at in range(self.epoch + 1):
            step = self.steps.get(at)
            if step is not None and step.action == "publish" and step.dimensions:
                # A backfill with other versions stands for everything after its
                # boundary, a range a rewind discarded (still to replay) included.
                kept = Coverage() if step.boundary is None else self.at(*step.boundary)
                latest = latest.rejudged(dict(step.dimensions), kept)
            latest = latest.adding(self.starts[at].batch_judgments())
            latest = latest.adding(
                judgment for b in self.batches.get(at, []) for judgment in b.judgments()
            )
        ahead = []
        for decision in latest.decisions(dimensions):
            begin = max(decision[2], reading_from.get((decision[0], decision[1]), 0))
            if begin < decision[3]:
                ahead.append((decision[0], decision[1], begin, *decision[3:]))
        return ahead

    def _chain(self) -> dict[int, int | None]:
        """The live epochs, from the current one back, with their last live batch
        (None: all): an epoch an operation began continues from its boundary (the
        batches after it were discarded); one no operation began continues the one
        before; emptied state, or state taken before any batch, ends it."""
        upto: dict[int, int | None] = {}
        at, last = self.epoch, None
        while at >= 0 and at not in upto:
            if at not in self.excluded:
                upto[at] = last
            step = self.steps.get(at)
            if step is None:
                at, last = at - 1, None
            elif step.action == "empty" or step.boundary is None:
                break
            elif at not in self.excluded and step.boundary[0] in self.excluded:
                self.floor = at
                break
            else:
                at, last = step.boundary
        return upto

    def standing(self) -> dict[int, int | None]:
        """The epochs whose batches' judgments of their records stand, each with its
        last such batch (None: all of them). The state's lineage, but back through
        every backfill (it recomputes the state, not which records it holds) and
        through a repair that kept a recreated topic's state (the deleted log's
        judgments are in it). A batch outside it was discarded by a rewind or a
        rebuild, and a replay judges its records again: its dead letters no longer
        stand (``jobs/superseded.py``)."""
        upto: dict[int, int | None] = {}
        at, last = self.epoch, None
        while at >= 0 and at not in upto:
            upto[at] = last
            step = self.steps.get(at)
            if step is None or step.action == "publish":
                at, last = at - 1, None
            elif step.action == "empty" or step.boundary is None:
                break
            else:
                at, last = step.boundary
        return upto

    def recomputed(self, epoch: int) -> Intervals:
        """What the backfill that began ``epoch`` judged again: the lineage's judged
        offsets after its boundary (all of them from the first offsets)."""
        step = self.steps[epoch]
        kept = Coverage() if step.boundary is None else self.at(*step.boundary)
        return self.at(epoch - 1).excluding(kept)

    def holds(self, epoch: int, batch_id: int) -> bool:
        if epoch not in self.upto:
            return False
        limit = self.upto[epoch]
        return limit is None or batch_id <= limit

    def boundaries(self, cuts: dict[int, tuple[Offsets, int]]) -> list[Boundary]:
        """Every live point the state can be taken from, in lineage order: batch ends
        that recorded their state version, and the cut (``cuts``: epoch -> offsets,
        watermark) of each completed operation on the lineage that left a version."""
        found = [
            Boundary(
                b.epoch,
                b.batch_id,
                b.end,
                b.state_version,
                b.reached,
                b.commit_time_us,
            )
            for batches in self.batches.values()
            for b in batches
            if b.state_version is not None and self.holds(b.epoch, b.batch_id)
        ]
        for epoch in self.upto:
            step = self.steps.get(epoch)
            if step is None or step.state_version is None or epoch not in cuts:
                continue
            offsets, watermark = cuts[epoch]
            found.append(
                Boundary(
                    epoch,
                    -1,
                    offsets,
                    step.state_version,
                    watermark,
                    step.done_us,
                    floor=epoch == self.floor,
                )
            )
        return sorted(found, key=lambda b: (b.epoch, b.batch_id))

    def coverage_at(self, boundary: Boundary) -> Coverage:
        return self.at(boundary.epoch, boundary.batch_id)

    def latest_before(self, boundaries: list[Boundary], target: Offsets) -> Boundary | None:
        """The last boundary (lineage order) at or before ``target`` in every partition
        ``target`` names. A target inside a range a skip left out is reached at the
        skip's end: the state there is the state before the gap, and the gap stays."""
        gaps = {epoch: start.gaps() for epoch, start in self.starts.items()}

        def fits(b: Boundary) -> bool:
            for tp, off in b.end_offsets.items():
                want = target.get(tp, off)
                last_gap = (gaps[b.epoch].get(tp) or [(off, -1)])[-1]
                if off > want and not (last_gap[1] == off and last_gap[0] <= want):
                    return False
            return True

        chosen = [b for b in boundaries if fits(b)]
        return chosen[-1] if chosen else None


def origin(batches: list[BatchEntry], first_cut: Offsets) -> Offsets:
    """Where the application first read each partition: epoch 0's cut, and for a
    partition that joined later, the start of the first batch with it."""
    found = dict(first_cut)
    for b in sorted(batches, key=lambda b: (b.epoch, b.batch_id)):
        for tp, off in b.end.items():
            found.setdefault(tp, b.start.get(tp, off))
    return found
