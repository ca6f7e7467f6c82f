"""Dead letters a repair judges again: removed once the lineage no longer stands by
them, so that every record ends in exactly one place.

A rewind that reprocesses (or a rebuild from the source) discards the batches
after its boundary, and its replay judges their records again: the replay writes
their dead letters in the new epoch. The discarded batches' dead letters then no
longer stand (``History.standing``), and ``dead_letter`` would show each of them
twice. They are deleted here, after the operation is done (before that, the
operation may die and the state go on with those batches: they still stand), and
again at every run's start, which completes what a crash in between left. Delta's
history keeps them (time travel), as it keeps the state a rewind went back from.

Only batch rows are judged here (batch id >= 0): an operation's own rows (batch
id -1) are ``cut.remove_orphans``'s.
"""

from __future__ import annotations

import logging

from deltalake import DeltaTable

from jobs.delta.layout import AppLayout
from jobs.delta.writer import fenced_properties
from jobs.ledger import snapshot

log = logging.getLogger(__name__)


def remove_superseded_dead_letters(layout: AppLayout) -> int:
    """Delete the dead letters of batches the lineage no longer stands by; the
    number of rows deleted."""
    path = layout.table("dead_letter")
    snap = snapshot(layout)
    if snap is None or not DeltaTable.is_deltatable(str(path)):
        return 0
    history = snap.history()
    standing = history.standing()
    # Discarded batches are a suffix of their epoch: its first one, per epoch. Only
    # their rows are named, so that Delta skips every other file by its statistics
    # (a run's start does not read the whole table).
    first: dict[int, int] = {}
    for epoch, entries in history.batches.items():
        last = standing.get(epoch, -1)
        for entry in entries:
            if last is not None and entry.batch_id > last:
                first[epoch] = min(first.get(epoch, entry.batch_id), entry.batch_id)
    if not first:
        return 0
    predicate = " OR ".join(
        f"(epoch = {epoch} AND batch_id >= {batch})" for epoch, batch in sorted(first.items())
    )
    props = fenced_properties(layout.application_id, snap.epoch, "supersede_dead_letters")
    metrics = DeltaTable(str(path)).delete(predicate, commit_properties=props)
    count = int(metrics.get("num_deleted_rows", 0) or 0)
    if count:
        log.info("removed %d dead letters of discarded batches (judged again)", count)
    return count
