"""A backfill computed beside the running stream (blue/green), fenced only to catch up.

Stop-the-world, a backfill fences the stream and then recomputes the whole history
it repairs: the stream's downtime grows with that history. Beside the stream, the
recomputation of everything the stream had judged when the backfill was planned
runs first, while the stream keeps committing and stays the application's only
publisher (nothing is written meanwhile: the shadow's rows stay in this process).
It then catches up on the batches the stream committed since, a step at a time,
until few records remain. Only then is the stream fenced; the last step reads just
the records its last batches judged, aggregated onto the shadow's rows, and the
result is published as a stop-the-world backfill publishes it. The downtime is
that step and the publish: it grows with the state and the last batches, not with
the history.

A step reads exactly the offsets the new plan judges and the shadow's did not,
with the judgments (watermark, batch time, table versions) the ledger recorded for
them, so the result is the stop-the-world backfill's over the same records: the
aggregation is a merge of contributions, and the shadow's rows are contributions
like a boundary's state. A plan whose computation differs in anything but its head
(another boundary, source or pinned tables, or ranges that are not a superset)
is recomputed whole. A crash before the fence leaves the application untouched;
after it, the backfill is applied or refused as stop-the-world.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from jobs.faults import maybe_crash
from jobs.lineage import Intervals, spelled, subtract

if TYPE_CHECKING:  # the command line reads this module's settings: it stays light
    import pyarrow as pa

    from jobs.delta.layout import AppLayout
    from jobs.operations.plan import Plan

Form = Literal["blue-green", "stop-the-world"]
# Steps before the fence end once at most this many records remain for the fenced
# step, or after this many steps (a stream that commits faster than a step reads).
CATCH_UP_RECORDS = 20_000
MAX_SWITCH_WITHIN = 10**9
MAX_STEPS = 5


@dataclass(frozen=True)
class Shadow:
    """The backfill's recomputation up to ``plan``'s head, held in this process."""

    plan: Plan
    corrected: pa.Table
    letters: pa.Table


Recompute = Callable[["Plan", "Intervals | None", "Shadow | None"], "tuple[pa.Table, pa.Table]"]


def form_of(layout: AppLayout, saved_plan: bool, asked: Form = "blue-green") -> tuple[Form, str]:
    """The form a backfill applied now takes, and why."""
    from jobs.lock import holder

    if asked == "stop-the-world":
        return "stop-the-world", "asked for (--form stop-the-world)"
    if saved_plan:
        return "stop-the-world", "a saved plan applies to a stopped application"
    busy = holder(layout)
    if busy is None or not str(busy.get("purpose", "")).startswith("run"):
        return "stop-the-world", "no stream is running: nothing waits on the recomputation"
    return (
        "blue-green",
        "recomputed beside the running stream, which is fenced only for the catch-up on "
        "its last batches and the publish",
    )


def new_ranges(plan: Plan, shadow: Shadow) -> Intervals | None:
    """What ``plan`` reads that ``shadow`` has not, or None when the shadow cannot go
    on to ``plan`` (another computation than a later head of its own)."""
    before, now = shadow.plan, plan
    same = (
        before.boundary == now.boundary
        and before.seed_state_version == now.seed_state_version
        and before.source == now.source
        and before.dimensions == now.dimensions
        and before.dimension_versions == now.dimension_versions
        and before.read_from == now.read_from
    )
    if not same:
        return None
    read, wanted = before.ranges(), now.ranges()
    if subtract(read, wanted):  # something read is no longer wanted: not a later head
        return None
    return subtract(wanted, read)


def records_in(ranges: Intervals) -> int:
    return sum(end - begin for spans in ranges.values() for begin, end in spans)


def advanced(recompute: Recompute, shadow: Shadow | None, plan: Plan) -> Shadow:
    """``shadow`` caught up to ``plan`` (recomputed whole when it cannot be)."""
    added = None if shadow is None else new_ranges(plan, shadow)
    if shadow is None or added is None:
        corrected, letters = recompute(plan, None, None)
        return Shadow(plan, corrected, letters)
    if not added:
        return Shadow(plan, shadow.corrected, shadow.letters)
    import pyarrow as pa

    corrected, letters = recompute(plan, added, shadow)
    return Shadow(plan, corrected, pa.concat_tables([shadow.letters, letters]))


def beside_the_stream(
    recompute: Recompute,
    make_plan: Callable[[], Plan],
    echo: Callable[[str], None],
    within: int = CATCH_UP_RECORDS,
) -> Shadow:
    """Recompute while the stream runs, then catch up until at most ``within``
    records remain (or ``MAX_STEPS`` steps were taken)."""
    shadow = advanced(recompute, None, make_plan())
    echo(f"shadow: recomputed {shadow.plan.records_to_replay} record(s) beside the running stream")
    maybe_crash("after_shadow")
    for _step in range(MAX_STEPS):
        plan = make_plan()
        added = new_ranges(plan, shadow)
        if added is not None and records_in(added) <= within:
            break
        shadow = advanced(recompute, shadow, plan)
        shown = "whole" if added is None else f"{records_in(added)} record(s) ({spelled(added)})"
        echo(f"shadow: caught up on the stream's batches since: {shown}")
    return shadow


def catch_up_fenced(
    recompute: Recompute, shadow: Shadow, plan: Plan, echo: Callable[[str], None]
) -> Shadow:
    """The last step, under the fence: ``plan`` is made with the stream stopped."""
    added = new_ranges(plan, shadow)
    done = advanced(recompute, shadow, plan)
    shown = (
        "recomputed whole (the plan under the lock differs in more than its head)"
        if added is None
        else f"{records_in(added)} record(s) the stream's last batches judged"
    )
    echo(f"shadow: fenced catch-up: {shown}")
    return done
