"""The cut an epoch starts from: the one primitive every start of an application is.

A cut is the source offsets a new epoch starts from, the state snapshot that is
exact for them (if any), the watermark the application had reached, and the epoch
number. A new application's first cut has no snapshot and the pipeline's starting
offsets; rebuild, rewind and backfill plan theirs (``jobs/operations``) and
``apply_cut`` makes it the application's:

1. write the seed (the state snapshot) and the cut file (inert until 2.);
2. bump the epoch on every table of the layout, the ledger first (its bump commit
   is the operation's audit row): every writer of an older epoch is fenced;
3. remove what a fenced or crashed batch left in the tables without its ledger
   row, and what an operation that died before recording that it was done left
   (its rows; its state commits are undone in 4.), so that no table is ahead of
   the ledger;
4. apply the cut's state action to the published ``state`` table.

    <warehouse>/<app>/_checkpoints/epoch=<n>.json          the cut
    <warehouse>/<app>/_checkpoints/epoch=<n>.seed-<sha256>.parquet  the state snapshot, if any
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from deltalake import DeltaTable

from jobs.delta import layout as tables
from jobs.delta.layout import AppLayout, file_location
from jobs.delta.log import commit_infos
from jobs.delta.writer import OperationFence, bump_epoch
from jobs.errors import ConfigError, ConsistencyError, FencedError, SourceError
from jobs.faults import maybe_crash
from jobs.kafka_admin import TopicsNow
from jobs.kafka_source import offsets as kafka_offsets
from jobs.ledger import (
    IS_BATCH,
    LedgerVersion,
    beyond_horizon,
    current_epoch,
    current_ledger,
    last_batch,
    last_batches,
    read_ledger,
    unfinished_epochs,
)
from jobs.lineage import Boundary, History, Pin, origin
from jobs.pipeline.checks import definition_changes, only_rekeying, state_shape_changes
from jobs.pipeline.model import Pipeline
from jobs.warehouse import AlreadyExistsError, ChangedError, Landing, Location

log = logging.getLogger(__name__)
# Hex digits of a seed's SHA-256 in its name: unique among one epoch's attempts.
SEED_DIGEST_CHARS = 32
Offsets = kafka_offsets.Offsets


class Origin(StrEnum):
    """What made a cut."""

    PIPELINE = "pipeline"  # a new application: the pipeline's starting offsets
    REBUILD = "rebuild"
    REWIND = "rewind"
    BACKFILL = "backfill"


class StateAction(StrEnum):
    """What a cut does to the published ``state`` table."""

    KEEP = "keep"  # as it is (Spark is seeded from it)
    RESTORE = "restore"  # time-travelled back to a batch boundary's version
    EMPTY = "empty"  # emptied: the replay recomputes it
    PUBLISH = "publish"  # replaced by a backfill's recomputation


@dataclass(frozen=True)
class Cut:
    epoch: int
    starting_offsets: dict[str, dict[str, int]]
    origin: str  # an Origin value
    seed_rows: int | None = None  # rows in the seed file; None: start from empty state
    # The watermark the application had reached: windows that closed before the cut
    # stay closed (their late records are dead letters), whatever Spark's new
    # watermark is after a seed.
    watermark_ms: int = 0
    # The broker's topic ids when the cut was made: a topic deleted and recreated
    # since gets a new id, even when its new log is already longer than the old.
    topic_ids: dict[str, str] = field(default_factory=dict)
    # The pipeline's ``state_shape`` the epoch's Spark state has (None: a cut made
    # before it was recorded).
    state_shape: dict[str, Any] | None = None
    # The pipeline version and definition the epoch began with (``Pipeline.definition``).
    definition: dict[str, Any] | None = None
    # The seed's content (``write_seed``: its file is named by it); None: a seed
    # written before seeds were named by content, or no seed.
    seed_digest: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    def offsets(self) -> Offsets:
        return kafka_offsets.from_json_dict(self.starting_offsets)


def cut_file(layout: AppLayout, epoch: int) -> Location:
    return layout.checkpoints / f"epoch={epoch}.json"


def seed_file(layout: AppLayout, epoch: int, digest: str | None = None) -> Location:
    """Epoch ``epoch``'s seed of content ``digest`` (what its cut records), or the
    one name seeds had before they were named by content."""
    if digest is None:
        return layout.checkpoints / f"epoch={epoch}.seed.parquet"
    return layout.checkpoints / f"epoch={epoch}.seed-{digest}.parquet"


def read_cut(layout: AppLayout, epoch: int) -> Cut | None:
    path = cut_file(layout, epoch)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        data: dict[str, Any] = json.loads(text)
        cut = Cut(
            epoch=int(data["epoch"]),
            starting_offsets=data["starting_offsets"],
            origin=str(data.get("origin", Origin.PIPELINE.value)),
            seed_rows=None if data.get("seed_rows") is None else int(data["seed_rows"]),
            watermark_ms=int(data.get("watermark_ms", 0)),
            topic_ids={str(k): str(v) for k, v in dict(data.get("topic_ids") or {}).items()},
            state_shape=None if data.get("state_shape") is None else dict(data["state_shape"]),
            definition=None if data.get("definition") is None else dict(data["definition"]),
            seed_digest=None if data.get("seed_digest") is None else str(data["seed_digest"]),
        )
        cut.offsets()  # validates the shape
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ConfigError) as exc:
        raise ConsistencyError(
            f"cut file {path} is unreadable ({exc}); repair: python -m jobs rebuild "
            f"--pipeline {layout.application_id} --reason '...' (it writes a new cut)"
        ) from exc
    if cut.epoch != epoch:
        raise ConsistencyError(f"cut file {path} is for epoch {cut.epoch}, not {epoch}")
    return cut


def epochs_on_other_logs(layout: AppLayout, topic_ids: dict[str, str]) -> frozenset[int]:
    """The epochs that read another log of a topic than the one with ``topic_ids``
    (the topic was deleted and recreated since): their offsets are positions in a
    log that is gone, and compare with nothing in the new one."""
    found, ids = set(), {}
    for epoch in range(current_epoch(layout) + 1):
        cut = read_cut(layout, epoch)
        if cut is not None and cut.topic_ids:
            ids = cut.topic_ids
        if any(t in topic_ids and known != topic_ids[t] for t, known in ids.items()):
            found.add(epoch)
    return frozenset(found)


def latest_cut(layout: AppLayout, epoch: int) -> Cut | None:
    """The cut of ``epoch``, or of the newest epoch before it that has one (a
    fence epoch never gets a cut)."""
    for older in range(epoch, -1, -1):
        found = read_cut(layout, older)
        if found is not None:
            return found
    return None


def needs_rekeying(pipeline: Pipeline, cut: Cut) -> bool:
    """The epoch's checkpoint keys hopping windows by their start (written before
    they were keyed by their last pane) and nothing else changed: a seeded
    ``rebuild`` starts a checkpoint with the new keys from the unchanged state."""
    return only_rekeying(state_shape_changes(cut.state_shape, pipeline.state_shape, False))


def check_state_shape(
    layout: AppLayout, pipeline: Pipeline, cut: Cut, new_checkpoint: bool = False
) -> None:
    """Refuse a pipeline whose state does not fit the epoch's. ``new_checkpoint``:
    the state is seeded into a fresh checkpoint (a rewind's, rebuild's or
    backfill's), whose shuffle partitions and hopping window keys may differ (the
    published rows mean the same under either key)."""
    check_pipeline(layout, pipeline, cut, definition=False, new_checkpoint=new_checkpoint)


def check_against_current_cut(layout: AppLayout, pipeline: Pipeline, shape: bool = True) -> None:
    """``check_pipeline`` against the current epoch's cut (none yet: nothing to
    check); ``shape=False``: the definition only (an operation may change the shape)."""
    cut = latest_cut(layout, current_epoch(layout))
    if cut is not None:
        check_pipeline(layout, pipeline, cut, shape=shape)


def check_pipeline(
    layout: AppLayout,
    pipeline: Pipeline,
    cut: Cut,
    shape: bool = True,
    definition: bool = True,
    new_checkpoint: bool = False,
) -> None:
    """Refuse, before Spark starts, a pipeline that does not fit the epoch ``cut``
    began: what Spark's state holds (its ``state_shape``), and its definition,
    which must be the one recorded under the same version. The version is how the
    ledger, the output topic and a backfill tell results of one logic from another;
    it is compared with every epoch's cut and the newest batch that ran it."""
    app, version = pipeline.application_id, pipeline.version
    recorded = _recorded_definitions(layout, cut, version) if definition else []
    changes = (
        state_shape_changes(cut.state_shape, pipeline.state_shape, new_checkpoint) if shape else []
    )
    differing = [(where, definition_changes(d, pipeline)) for where, d in recorded]
    if changes and not new_checkpoint and only_rekeying(changes):
        raise ConfigError(
            f"pipeline {app}: epoch {cut.epoch}'s checkpoint keys hopping windows by their "
            f"start, this platform by their last pane ({changes[0]}): its checkpoint cannot "
            f"continue; repair: python -m jobs rebuild --pipeline {app} --reason ... (seeds "
            "a new checkpoint from the published state, which is unchanged; Kafka is not re-read)"
        )
    if changes:
        raise ConfigError(
            f"pipeline {app} v{version} changes what Spark's state holds since epoch "
            f"{cut.epoch} began ({'; '.join(changes)}): "
            + (
                "the state it would be seeded from does not fit it"
                if new_checkpoint
                else "its checkpoint cannot continue"
            )
            + f"; repair: python -m jobs backfill --pipeline {app} --from-earliest --reason "
            "... (republishes the state with the new definition), or python -m jobs rebuild "
            f"--pipeline {app} --from-source --reason ... (recomputes it from the source)"
        )
    for where, changed in differing:
        if changed:
            newest = max(int(d.get("version", 0)) for _w, d in recorded)
            newest = max(newest, version, _highest_version(layout))
            raise ConfigError(
                f"pipeline {app}: version {version} was recorded with another definition "
                f"({where}): {', '.join(changed)} "
                f"{'differs' if len(changed) == 1 else 'differ'}; set version: "
                f"{newest + 1} (results of another logic need another version; python -m "
                f"jobs backfill --pipeline {app} ... then republishes earlier results under it)"
            )


def recorded_definition(pipeline: Pipeline) -> dict[str, Any]:
    return {"version": pipeline.version, "parts": pipeline.definition}


def _recorded_definitions(
    layout: AppLayout, cut: Cut, version: int
) -> list[tuple[str, dict[str, Any]]]:
    """Each recorded definition, with where: every epoch's cut up to ``cut``'s (of
    any version), and the newest batch that ran ``version``."""
    recorded: list[tuple[str, dict[str, Any]]] = []
    for epoch in range(cut.epoch + 1):
        found = cut if epoch == cut.epoch else read_cut(layout, epoch)
        if found is not None and found.definition:
            recorded.append((f"epoch {epoch}'s cut", found.definition))
    last = last_batch(layout, ds.field("pipeline_version") == version)
    if last is not None:
        kept = json.loads(last["details"] or "{}").get("definition")
        if kept:
            recorded.append((f"epoch {last['epoch']} batch {last['batch_id']}", kept))
    return recorded


def epoch_start(layout: AppLayout, pipeline: Pipeline, topics: TopicsNow) -> Cut:
    """The cut the current epoch starts from, checked against the pipeline
    (``check_pipeline``) and the brokers (a topic recreated since). A new
    application's first cut comes from the pipeline's ``starting_offsets`` against
    the brokers now, written once so that every restart agrees; maintenance
    operations write their own."""
    epoch = current_epoch(layout)
    cut = read_cut(layout, epoch)
    if cut is not None:
        check_pipeline(layout, pipeline, cut)
        check_same_topics(cut.topic_ids, topics.ids)
        return cut
    if epoch > 0:
        raise ConsistencyError(
            f"epoch {epoch} of {layout.application_id} has no cut: an operation fenced the "
            "application and did not finish; run the operation again (see the ledger)"
        )
    start = kafka_offsets.resolve_starting_offsets(
        pipeline.starting_offsets, topics.partitions, topics.marks
    )
    first = Cut(
        epoch=epoch,
        starting_offsets=kafka_offsets.to_json_dict(start),
        origin=Origin.PIPELINE.value,
        topic_ids=topics.ids,
        state_shape=pipeline.state_shape,
        definition=recorded_definition(pipeline),
    )
    return claim_first_cut(layout, first)


def _highest_version(layout: AppLayout) -> int:
    rows = read_ledger(layout, ["pipeline_version"], IS_BATCH)
    if rows is None or rows.num_rows == 0:
        return 0
    return int(max(v for v in rows["pipeline_version"].to_pylist() if v is not None))


def claim_first_cut(layout: AppLayout, first: Cut) -> Cut:
    """The application's first cut: ``first`` if no run wrote one before (created
    put-if-absent), else that one, so that every run of epoch 0 starts alike (a
    ``latest`` start resolves to other offsets each time)."""
    try:
        cut_file(layout, first.epoch).create(first.to_json().encode())
    except AlreadyExistsError:
        found = read_cut(layout, first.epoch)
        assert found is not None
        return found
    return first


def write_cut(layout: AppLayout, cut: Cut) -> None:
    """Write ``cut`` as its epoch's, whole, put-if-absent. Another attempt's cut of
    that epoch is replaced only while no attempt has fenced the epoch (it died, or
    is paused, before its bump), and only if it is still the version read: once the
    epoch began, its cut never changes. ``FencedError``: this attempt was overtaken.
    An attempt whose cut is replaced after all and whose bump wins stops after it
    (``check_cut_kept``)."""
    target = cut_file(layout, cut.epoch)
    data = cut.to_json().encode()
    try:
        target.create(data)
        return
    except AlreadyExistsError:
        pass
    found = target.stat()
    if found is not None and target.read_bytes() == data:
        return  # this cut already: a retry of the same attempt
    if current_epoch(layout) >= cut.epoch:
        raise FencedError(
            f"epoch {cut.epoch} of {layout.application_id} began with another cut ({target}): "
            "this attempt was overtaken (paused, or its hold lost) and writes nothing"
        )
    if not target.is_s3 or found is None or found.etag is None:
        target.write_bytes(data)  # a local warehouse is held with flock: that writer is gone
        return
    try:
        target.update(data, found.etag)
    except ChangedError:
        if target.read_bytes() == data:
            return  # this attempt's own replacement, whose answer was lost
        raise FencedError(
            f"another attempt wrote epoch {cut.epoch}'s cut of {layout.application_id} "
            "meanwhile: this one writes nothing"
        ) from None


def check_cut_kept(layout: AppLayout, cut: Cut) -> None:
    """After the bump: the epoch's cut is still the one this attempt wrote. Else
    another attempt replaced it while this one was paused between its check and its
    bump: the epoch is this attempt's, its start is not; it stops (the operation run
    again completes the epoch in the next one)."""
    try:
        stored = cut_file(layout, cut.epoch).read_bytes()
    except FileNotFoundError:
        stored = b""
    if stored != cut.to_json().encode():
        raise FencedError(
            f"epoch {cut.epoch} of {layout.application_id} is fenced by this attempt, but its "
            "cut is not the one it wrote (another attempt replaced it while this one was "
            "paused): it stops here; run the operation again to complete the epoch"
        )


def starting_offsets(
    cut: Cut,
    marks: kafka_offsets.Watermarks,
    first_batch: bool = True,
    ids_now: Mapping[str, str] | None = None,
) -> Offsets:
    """The cut's offsets against the broker now: partitions added since the cut
    start at their log start (as Spark's Kafka source does); a partition of the cut
    that is gone, or whose log no longer reaches the cut's offset, is an error.

    Once the epoch has planned a batch, Spark resumes from its offset log and the
    cut's offsets only name batch 0's start: retention may long have deleted them
    (the source still checks every range it reads)."""
    start = cut.offsets()
    kafka_offsets.check_continuity(start, marks, same_ids(cut.topic_ids, ids_now or {}))
    if first_batch:
        kafka_offsets.check_not_expired(start, marks)
    added = {tp: low for tp, (low, _high) in marks.items() if tp not in start}
    if added:
        log.info("partitions added since the cut start at their log start: %s", added)
    return {**start, **added}


def first_offsets(layout: AppLayout) -> Offsets:
    """Where the application first read each partition of the topics' current logs
    (``coverage.origin``): epochs that read a deleted log are left out, their
    offsets are positions in a log that is gone."""
    ledger_now = current_ledger(layout)
    history = None if ledger_now is None else current_log_history(layout, ledger_now)
    first_cut = None if history and 0 in history.excluded else read_cut(layout, 0)
    batches = [] if history is None else [b for e in history.batches.values() for b in e]
    return origin(batches, {} if first_cut is None else first_cut.offsets())


def fill_from_first(layout: AppLayout, start: Offsets, marks: kafka_offsets.Watermarks) -> Offsets:
    """``start`` (a batch boundary's offsets) completed for partitions it does not
    name: where the application first read them, or their log start if it never
    did. Records deleted since make it an error."""
    first = first_offsets(layout)
    filled = {tp: start.get(tp, first.get(tp, low)) for tp, (low, _high) in marks.items()}
    _check_kept(filled, marks, "the recomputation")
    return filled


def replay_from_origin(layout: AppLayout, marks: kafka_offsets.Watermarks, what: str) -> Offsets:
    """The offsets a recomputation from the start reads from: the application's own
    first offsets, never "whatever the log start is now". Records the application
    read that retention has deleted since make it an error (nothing is skipped)."""
    origin = first_offsets(layout)
    start = {tp: origin.get(tp, low) for tp, (low, _high) in marks.items()}
    _check_kept(start, marks, what)
    return start


def _check_kept(start: Offsets, marks: kafka_offsets.Watermarks, what: str) -> None:
    gone = {
        f"{tp[0]}[{tp[1]}]": f"{off}..{marks[tp][0] - 1}"
        for tp, off in sorted(start.items())
        if off < marks[tp][0]
    }
    if gone:
        raise SourceError(
            f"{what} would replay from the application's first offsets, but records "
            f"{gone} are no longer on the broker (retention); nothing was changed. "
            "Use backfill --source archive (pipelines with source.archive: true), or "
            "rewind --mode skip to accept the loss explicitly"
        )


def fenced_tables(layout: AppLayout, pipeline: Pipeline) -> list[Location]:
    """Every table of the application, in fencing order: the ledger first, so that no
    batch of an older epoch can complete once a bump has started."""
    names = [tables.LEDGER] + [n for n in tables.table_names(pipeline) if n != tables.LEDGER]
    return [layout.table(n) for n in names]


def remove_orphans(
    layout: AppLayout,
    fenced: list[Location],
    new_epoch: int,
    fence: OperationFence,
    unfinished: list[int] | None = None,
) -> dict[str, int]:
    """Rows that batches wrote without their ledger row (fenced or crashed between
    two commits) are removed from the ``fenced`` tables: every table ends where the
    ledger does (the ledger itself, and ``state``, whose orphans are undone by the
    cut's state action, are left). So are the rows (batch id -1) of operations that
    died before they were done (epochs ``unfinished``): the operation completing
    them writes them again, once. Call after the epoch bump (nothing of an older
    epoch can be written any more)."""
    last = last_batches(read_ledger(layout, ["entry_type", "epoch", "batch_id"], IS_BATCH))
    # Batches of an epoch commit in order, so a table row is committed iff its
    # batch id is at most the ledger's last one for its epoch.
    kept = " OR ".join(f"(epoch = {e} AND batch_id <= {b})" for e, b in sorted(last.items()))
    orphan = f"batch_id >= 0 AND epoch < {new_epoch}" + (f" AND NOT ({kept})" if kept else "")
    died = [e for e in unfinished or [] if e < new_epoch]
    if died:
        epochs = ", ".join(str(e) for e in died)
        orphan = f"({orphan}) OR (batch_id = -1 AND epoch IN ({epochs}))"
    removed: dict[str, int] = {}
    for path in fenced:
        name = path.name
        if name in (tables.LEDGER, "state"):
            continue
        table = DeltaTable(str(path))
        metrics = table.delete(orphan, commit_properties=fence.on(table))
        count = int(metrics.get("num_deleted_rows", 0) or 0)
        if count:
            removed[name] = count
            log.warning("removed %d rows of %s left by uncommitted batches", count, name)
    return removed


def orphan_state_version(layout: AppLayout, boundary_version: int | None) -> int | None:
    """The state version to go back to when batches merged into ``state`` after the
    ledger's last batch (``boundary_version``) without their ledger row; None when
    the state is consistent with the ledger."""
    if boundary_version is None:
        return None
    last = last_batches(read_ledger(layout, ["entry_type", "epoch", "batch_id"], IS_BATCH))
    path = layout.table("state")
    versions = [
        version
        for version, e in commit_infos(path, boundary_version + 1).items()
        if e.get("platform_operation") == "batch"
        and int(e.get("batch_id", -1)) > last.get(int(e.get("epoch", -1)), -1)
    ]
    return min(versions) - 1 if versions else None


def unfinished_state_version(layout: AppLayout, unfinished: list[int]) -> int | None:
    """The state version to go back to when operations that died before they were
    done (epochs ``unfinished``) wrote ``state`` (a backfill's merge or swap, a
    restore): the version before the first of them; None when none wrote it."""
    epochs = {str(e) for e in unfinished}
    if not epochs:
        return None
    versions = [
        version
        for version, e in commit_infos(layout.table("state")).items()
        if e.get("epoch") in epochs
        and e.get("platform_operation") not in (None, "epoch_bump", "batch", "maintain")
    ]
    return min(versions) - 1 if versions else None


def live_boundaries(
    layout: AppLayout,
    ledger_now: LedgerVersion | None = None,
    other_logs: frozenset[int] = frozenset(),
) -> list[Boundary]:
    """Every point of the live lineage the state can be taken from, in order: its
    batch boundaries, and the cut of each completed operation on it (batch id -1:
    its offsets and the state version it left; a skip's target, a backfill's end).
    ``other_logs``: epochs that read a topic's deleted log, left out."""
    ledger_now = ledger_now or current_ledger(layout)
    if ledger_now is None:
        return []
    history = ledger_now.history(other_logs)
    cuts = {}
    for epoch in history.upto:
        cut = read_cut(layout, epoch) if epoch in history.steps else None
        if cut is not None:
            cuts[epoch] = (cut.offsets(), cut.watermark_ms)
    return history.boundaries(cuts)


def lineage_head(layout: AppLayout, ledger_now: LedgerVersion | None = None) -> Boundary | None:
    """Where the application's live lineage ends: its last batch boundary or, when a
    completed operation began an epoch after that batch and no batch ran since, the
    operation's cut. What a rebuild or a skip continues from: the last batch would
    undo that operation."""
    boundaries = live_boundaries(layout, ledger_now)
    return boundaries[-1] if boundaries else None


def boundary_at_or_before(
    layout: AppLayout, target: Offsets, other_logs: frozenset[int] = frozenset()
) -> Boundary | None:
    """The latest point of the live lineage at or before ``target`` in every
    partition (``History.latest_before``: a target inside a skipped range is
    reached at its end), never before the floor (``log_floor``); None: before the
    first batch. ``other_logs``: epochs that read an earlier log of a topic
    (deleted and recreated since): their offsets do not compare with ``target``'s."""
    ledger_now = current_ledger(layout)
    if ledger_now is None:
        return None
    history = ledger_now.history(other_logs)
    chosen = history.latest_before(live_boundaries(layout, ledger_now, other_logs), target)
    if history.floor is not None and (chosen is None or chosen.floor):
        return log_floor(layout, ledger_now)  # kept by maintain whatever its age
    if chosen is None:
        if other_logs and not history.upto:
            raise ConfigError(
                f"{layout.application_id}: every batch so far read a log of a topic that was "
                "deleted and recreated since: move the application onto the new log first "
                f"(python -m jobs rewind --pipeline {layout.application_id} --to-earliest "
                "--topics <topic> --mode skip --reason ..., which keeps the state)"
            )
        return None
    _check_restorable(
        layout,
        chosen,
        "the batch boundary at or before the target",
        "choose a later target (python -m jobs status shows the oldest kept boundary), "
        "rewind --mode skip, or rebuild --from-source",
    )
    return chosen


def log_floor(layout: AppLayout, ledger_now: LedgerVersion | None = None) -> Boundary | None:
    """Where a recomputation "from the first offsets" starts (``History.floor``):
    the cut that moved the application onto a recreated topic's new log keeping
    its state, which holds the deleted log's judgments; None: from empty state.
    ``ledger_now``: the ledger read the caller planned from, else one read now."""
    ledger_now = ledger_now or current_ledger(layout)
    if ledger_now is None:
        return None
    history = current_log_history(layout, ledger_now)
    if history.floor is None:
        return None
    for found in live_boundaries(layout, ledger_now, history.excluded):
        if found.floor:
            # ``maintain`` keeps this version whatever its age (not only the
            # horizon's): the question is whether its files are there.
            if not loadable(layout.table("state"), found.state_version):
                raise ConsistencyError(
                    f"{layout.application_id}: the state that holds the judgments of a "
                    f"recreated topic's deleted log (epoch {found.epoch}, state version "
                    f"{found.state_version}) can no longer be loaded; repair: recompute from "
                    "a later boundary (backfill --from-offset or --from-datetime, rewind "
                    "--mode reprocess to a later target)"
                )
            return found
    raise ConsistencyError(
        f"{layout.application_id}: epoch {history.floor} moved the application onto a "
        "recreated topic's new log, but its cut or state version is missing; repair: "
        "recompute from a later boundary (backfill --from-offset or --from-datetime)"
    )


def loadable(table: Location, version: int) -> bool:
    """Whether ``table`` at ``version`` can be read: its log and every data file."""
    try:
        files = DeltaTable(str(table), version=version).file_uris()
    except Exception:
        return False
    return all(file_location(uri).stat() is not None for uri in files)


def table_id(table: str, version: int | None = None) -> str | None:
    """Delta's id of the table at ``table`` (``metaData.id``) as of ``version`` (None:
    its newest); None: no table there, or not that version."""
    try:
        return str(DeltaTable(table, version=version).metadata().id)
    except Exception:
        return None


def check_readable(application_id: str, name: str, path: str, pins: set[Pin | None]) -> None:
    """One error naming the first table of enrichment ``name`` (now at ``path``) that
    recorded batches joined and that a replay can no longer read as they did: its
    version is gone, or the table at its location is another one (deleted and loaded
    again: another table id), and the repair. (Which tables a replay needs is the
    coverage's to say.)"""
    repair = (
        "; repair: backfill --dimensions newest (recomputes with the table's newest "
        "version and records it), then this again"
    )
    for pin in sorted(pins, key=lambda p: (-1, "", "") if p is None else (p.version, p.path, "")):
        if pin is None:
            raise ConfigError(
                f"{application_id}: enrich {name}: {path} has no version from before a "
                "batch's time" + repair
            )
        where = pin.path or path
        # Another table there first: a reloaded one starts again at version 0, so the
        # recorded version may be missing for that reason.
        if pin.table_id and table_id(where, pin.version) != pin.table_id:
            found = table_id(where)
            if found is not None and found != pin.table_id:
                raise ConfigError(
                    f"{application_id}: enrich {name}: {where} is not the table the batches "
                    f"that judged its records joined (table id {pin.table_id} recorded, "
                    f"{found} there now: it was deleted and loaded again), so version "
                    f"{pin.version} is not what they read" + repair
                )
        if not loadable(Location.parse(where, "a dimension table"), pin.version):
            raise ConfigError(
                f"{application_id}: enrich {name}: {where} version {pin.version}, which a "
                "replay joins (the version recorded by the batches that judged its records, "
                "or the table's oldest), can no longer be read (its log or files were "
                "removed)" + repair
            )


def floor_note(floor: Boundary, target: Offsets | None = None) -> str:
    """A plan's note when it starts from the floor; ``target``: what was asked for,
    named where it lies before the floor."""
    before = {tp: off for tp, off in (target or {}).items() if off < floor.end_offsets.get(tp, off)}
    asked = (
        ", ".join(f"{t}[{p}] {off}" for (t, p), off in sorted(before.items()))
        + " is before the cut that moved the application onto a recreated topic's new "
        "log: it starts from that cut, and "
        if before
        else ""
    )
    return (
        f"{asked}keeps the judgments of the recreated topic's deleted log as epoch "
        f"{floor.epoch} kept them (state version {floor.state_version}): no broker holds "
        "those records"
    )


def _check_restorable(layout: AppLayout, chosen: Boundary, what: str, repair: str) -> None:
    kept = beyond_horizon(layout, chosen.state_version)
    if kept is not None:
        raise ConsistencyError(
            f"{layout.application_id}: {what} (epoch {chosen.epoch} batch {chosen.batch_id}) "
            "is older than the rewind horizon: maintain removed the files of its state "
            f"(kept from state version {kept}); {repair}"
        )


def current_log_history(layout: AppLayout, ledger_now: LedgerVersion) -> History:
    """The coverage without the epochs that read a topic's deleted log (what the
    application reads now is the current cut's log): what verify recomputes and
    whose judgments a backfill reuses."""
    cut = latest_cut(layout, ledger_now.epoch)
    ids = {} if cut is None else cut.topic_ids
    return ledger_now.history(epochs_on_other_logs(layout, ids))


def state_behind(layout: AppLayout) -> int | None:
    """The state version an operation starts from when ``state`` is ahead of the
    ledger: batches merged after the lineage's head without their ledger row, or
    operations that died after their fence wrote it. None: it is consistent."""
    last = lineage_head(layout)
    versions = [
        v
        for v in (
            orphan_state_version(layout, None if last is None else last.state_version),
            unfinished_state_version(layout, unfinished_epochs(layout)),
        )
        if v is not None
    ]
    return min(versions) if versions else None


@dataclass(frozen=True)
class StateChange:
    """What a cut does to the published ``state`` table: the plan's action, with
    what is beyond the ledger (``state_behind``) undone first. A KEEP restores to
    there, a PUBLISH (``publish``: the backfill's commit) publishes onto it; a
    RESTORE goes back to ``restore_to``, a boundary before all of it."""

    action: StateAction
    restore_to: int | None = None
    behind: int | None = None
    publish: Callable[[], dict[str, Any]] | None = None

    def resolved(self) -> StateChange:
        if self.behind is not None and self.action is StateAction.KEEP:
            return StateChange(StateAction.RESTORE, self.behind, self.behind, self.publish)
        return self


def apply_cut(
    layout: AppLayout,
    pipeline: Pipeline,
    cut: Cut,
    kept_topic_ids: dict[str, str],
    reason: str,
    audit: pa.Table,
    seed: pa.Table | None,
    unfinished: list[int],
    state: StateChange,
) -> dict[str, Any]:
    """Make ``cut`` the application's (steps 1-4 of the module docstring), each
    commit fenced by the new epoch (its ``origin`` names the operation). First,
    before anything is written: a topic
    recreated since the previous cut is accepted only where the operation points it
    at its new log (``kept_topic_ids``: the previous cut's ids of the others).
    ``unfinished``: the epochs of operations that died, which this cut completes.
    Returns what it did, for the operation's audit row."""
    check_same_topics(kept_topic_ids, cut.topic_ids)
    paths = fenced_tables(layout, pipeline)
    if seed is not None:
        cut = replace(cut, seed_digest=write_seed(seed, layout, cut.epoch))
    write_cut(layout, cut)
    fence = OperationFence(
        pipeline.application_id,
        cut.epoch,
        cut.origin,
        {"reason": reason, "pipeline_version": str(pipeline.version)},
    )
    maybe_crash("before_bump")
    bump_epoch(paths, pipeline.application_id, cut.epoch, reason, first_rows=audit)
    check_cut_kept(layout, cut)
    orphans = remove_orphans(layout, paths, cut.epoch, fence, unfinished)
    maybe_crash("after_fence")
    # What ``state`` holds beyond the ledger, judged now that every table is fenced:
    # before the bump reached ``state``, a stream paused past its lease could still
    # merge a batch there (its ledger row then refused).
    state = replace(state, behind=state_behind(layout)).resolved()
    result: dict[str, Any] = {
        "seeded_rows": cut.seed_rows or 0,
        "state_action": state.action.value,
        "orphan_rows_removed": orphans,
    }
    if state.behind is not None:
        result["state_undone_to_version"] = state.behind
    result.update(_change_state(layout.table("state"), state, fence))
    return result


def _change_state(path: Location, state: StateChange, fence: OperationFence) -> dict[str, Any]:
    """The state action in one fenced commit (a PUBLISH: after undoing what is
    beyond the ledger). Returns what it did and the state's version after it."""
    result: dict[str, Any] = {}
    table = DeltaTable(str(path))
    if state.action is StateAction.RESTORE:
        assert state.restore_to is not None
        table.restore(state.restore_to, commit_properties=fence.on(table))
        result["restored_version"] = state.restore_to
    elif state.action is StateAction.EMPTY:
        table.delete(commit_properties=fence.on(table))
    elif state.action is StateAction.PUBLISH:
        assert state.publish is not None
        if state.behind is not None:
            table.restore(state.behind, commit_properties=fence.on(table))
        result.update(state.publish())
    result["state_version"] = DeltaTable(str(path)).version()
    return result


def write_seed(rows: pa.Table, layout: AppLayout, epoch: int) -> str:
    """Write epoch ``epoch``'s seed, whole, under a name made of its content; returns
    that digest (the cut records it). Two attempts of one epoch never share a name,
    so one never replaces the seed another's cut names."""
    landing = seed_file(layout, epoch).landing()  # a crash leaves no half-written seed
    try:
        pq.write_table(rows, landing.path)
        digest = hashlib.sha256()
        with open(landing.path, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
        named = digest.hexdigest()[:SEED_DIGEST_CHARS]
        Landing(seed_file(layout, epoch, named), landing.path).land()
    finally:
        landing.discard()
    return named


def same_ids(recorded: Mapping[str, str], now: Mapping[str, str]) -> set[str]:
    """Topics whose id was recorded and the broker reports unchanged."""
    return {t for t, i in recorded.items() if now.get(t) == i}


def check_same_topics(recorded: Mapping[str, str], now: Mapping[str, str]) -> None:
    """A topic whose id changed since the cut was deleted and recreated: its offsets
    name other records. Stop and name the repair; never read on."""
    for topic, topic_id in sorted(recorded.items()):
        current = now.get(topic)
        if current is not None and current != topic_id:
            raise SourceError(
                f"topic {topic!r} was deleted and recreated since the application's cut (topic "
                f"id {topic_id}, now {current}): its offsets name other records; repair: python "
                f"-m jobs rewind --to-earliest --topics {topic} --mode skip --reason ... (keeps "
                "the state, reads the new topic from its start)"
            )
