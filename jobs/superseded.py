"""Dead letters a repair judges again: removed once the lineage no longer stands by
them, so that every record ends in exactly one place.

- A rewind that reprocesses (or a rebuild from the source) discards the batches
  after its boundary, and its replay judges their records again, writing their
  dead letters in the new epoch: the discarded batches' dead letters go
  (``History.standing``).
- A backfill judges every record after its boundary again (a fixed dimension may
  find a key that was missing) and appends what it judges dead letters, in its
  epoch (batch id -1): the earlier dead letters of those ranges go
  (``History.recomputed``), and a backfill a later rewind discarded takes its own.

This runs after the operation is done (before that, the operation may die and the
state go on without it: what it would supersede still stands) and again at every
run's start, which completes what a crash in between left. A backfill's ranges are
looked at until a batch commits after it (that run's start removed them): the
delete names few rows and files, whatever the table's age. Until then a reader may
see a record's dead letter twice, never none. Delta's history keeps what was
removed (time travel), as it keeps the state a rewind went back from. An
operation's rows of an operation that died are ``cut.remove_orphans``'s.
"""

from __future__ import annotations

import logging

from deltalake import DeltaTable

from jobs.cut import current_log_history
from jobs.delta.layout import AppLayout
from jobs.delta.writer import OperationFence
from jobs.ledger import current_ledger
from jobs.lineage import History, Intervals

log = logging.getLogger(__name__)


def remove_superseded_dead_letters(layout: AppLayout) -> int:
    """Delete the dead letters the lineage no longer stands by; the rows deleted."""
    path = layout.table("dead_letter")
    ledger_now = current_ledger(layout)
    if ledger_now is None or not DeltaTable.is_deltatable(str(path)):
        return 0
    history = ledger_now.history()
    clauses = _discarded(history)
    newest_batch = max(history.batches, default=-1)
    recent = [
        epoch
        for epoch in history.standing()
        if epoch > newest_batch and getattr(history.steps.get(epoch), "action", "") == "publish"
    ]
    if recent:
        clauses += _judged_again(current_log_history(layout, ledger_now), recent)
    if not clauses:
        return 0
    fence = OperationFence(layout.application_id, ledger_now.epoch, "supersede_dead_letters")
    table = DeltaTable(str(path))
    metrics = table.delete(" OR ".join(clauses), commit_properties=fence.on(table))
    count = int(metrics.get("num_deleted_rows", 0) or 0)
    if count:
        log.info("removed %d dead letters a repair judged again", count)
    return count


def _discarded(history: History) -> list[str]:
    """The rows of batches (and backfills) the lineage discarded. A discarded
    epoch's batches are a suffix of it: named by its first one, so that Delta skips
    every other file by its statistics (a run's start does not read the table)."""
    standing = history.standing()
    first: dict[int, int] = {}
    for epoch, entries in history.batches.items():
        last = standing.get(epoch, -1)
        for entry in entries:
            if last is not None and entry.batch_id > last:
                first[epoch] = min(first.get(epoch, entry.batch_id), entry.batch_id)
    clauses = [f"(epoch = {e} AND batch_id >= {b})" for e, b in sorted(first.items())]
    clauses += [
        f"(epoch = {epoch} AND batch_id = -1)"
        for epoch, step in sorted(history.steps.items())
        if step.action == "publish" and epoch not in standing
    ]
    return clauses


def _judged_again(current: History, backfills: list[int]) -> list[str]:
    """The rows of each backfill's ranges from before it: of the epochs from its
    boundary's on (earlier rows are of offsets before its boundary, or discarded),
    and of the current log (rows of epochs that read a deleted log stay)."""
    clauses = []
    others = f" AND epoch NOT IN ({', '.join(map(str, sorted(current.excluded)))})"
    for epoch in sorted(backfills):
        step = current.steps[epoch]
        if epoch in current.excluded:
            continue
        places = _places(current.recomputed(epoch))
        if places:
            since = 0 if step.boundary is None else step.boundary[0]
            older = f"epoch >= {since} AND epoch < {epoch}" + (others if current.excluded else "")
            clauses.append(f"({older} AND ({places}))")
    return clauses


def _places(ranges: Intervals) -> str:
    return " OR ".join(
        f"(topic = '{topic}' AND partition = {part} AND offset >= {begin} AND offset < {end})"
        for (topic, part), spans in sorted(ranges.items())
        for begin, end in spans
    )
