"""Which version of each dimension table a range of records joins (``enrich:``).

A batch joins the version committed at or before its planned time (``pinned`` in
``enrichment.py``). A replay through records that earlier batches judged joins the
versions those batches recorded: ``replay_ranges`` reads them from the ledger's
lineage, merged into ranges with the pin each joins; a backfill chooses between
the recorded versions and the newest (``joined_versions``). A version that can no
longer be read as recorded is one error naming the table.
"""

from __future__ import annotations

from typing import Any

from deltalake import DeltaTable
from pyspark.sql import SparkSession

from jobs.cut import check_readable, current_log_history, table_id
from jobs.delta.layout import AppLayout
from jobs.errors import ConfigError
from jobs.kafka_source.offsets import Offsets
from jobs.ledger import current_ledger
from jobs.lineage import Pin
from jobs.resolution import Resolved
from jobs.streaming import offset_log


def replay_ranges(
    spark: SparkSession, resolved: Resolved, layout: AppLayout, cut: Offsets
) -> list[tuple[Any, ...]]:
    """The ranges at or after ``cut`` (the epoch's; from its last ledger batch on, the
    one batch Spark may run again, unless its own commit log holds it) that earlier
    batches judged, merged, with the tables a replay joins there."""
    ledger_now = current_ledger(layout) if resolved.pipeline.enrich else None
    if ledger_now is None:
        return []
    history = current_log_history(layout, ledger_now)
    names = tuple(e.name for e in resolved.pipeline.enrich)
    committed = offset_log.committed_batches(layout.checkpoint(history.epoch))
    reading_from = history.replay_from(cut, committed[-1] if committed else None)
    decisions = history.replay_decisions(reading_from, names)
    if not decisions:
        return []
    _newest, ranges = joined_versions(spark, resolved, decisions)
    return merged(ranges, len(names))


def joined_versions(
    spark: SparkSession,
    resolved: Resolved,
    ranges: list[tuple[Any, ...]],
    chosen: dict[str, Pin] | None = None,
) -> tuple[list[Pin], list[tuple[Any, ...]]]:
    """Each enrichment's table for records outside ``ranges`` (its newest version, or
    the chosen pin), and ``ranges`` (``Coverage.decisions``) with the pin each range
    joins: the one its batch recorded (a batch from before the enrichment, of a
    pipeline version without it: the version the stream would have joined at its
    time, or the table's oldest one if it did not exist yet), or the ``chosen`` one.
    A table that can no longer be read as recorded is one error naming it."""
    newest_pins: list[Pin] = []
    filled = [list(r) for r in ranges]
    for i, e in enumerate(resolved.pipeline.enrich):
        path = resolved.dimensions[e.name].path
        kept = history(spark, path)
        picked = (chosen or {}).get(e.name)
        known: dict[int, Pin] = {}  # one read of the log per version, however many ranges

        def pin_at(version: int, path: str = path, known: dict[int, Pin] = known) -> Pin:
            if version not in known:
                known[version] = current_pin(path, version)
            return known[version]

        newest_pins.append(picked or pin_at(max(v for v, _ms in kept)))
        for r in filled:
            if picked is not None:
                r[6 + i] = picked
            elif r[6 + i] is None:
                at_its_time = version_at(kept, int(r[5]))
                r[6 + i] = pin_at(min(v for v, _ms in kept) if at_its_time is None else at_its_time)
        check_readable(resolved.application_id, e.name, path, {r[6 + i] for r in filled})
    return newest_pins, [tuple(r) for r in filled]


def current_pin(path: str, version: int) -> Pin:
    """The table at ``path`` now, at ``version``."""
    return Pin(version, table_id(path, version) or "", path)


def newest_pin(path: str) -> Pin:
    """The table at ``path`` at its newest version (one error: no table there)."""
    try:
        version = DeltaTable(path).version()
    except Exception as e:
        raise ConfigError(f"no dimension table at {path} ({e}): load it first") from None
    return current_pin(path, version)


def merged(ranges: list[tuple[Any, ...]], count: int) -> list[tuple[Any, ...]]:
    """``joined_versions`` ranges as (topic, partition, begin, end, *versions), adjacent ones
    with the same versions as one (a replay's join then looks through a few ranges
    per partition, not one per batch)."""
    out: list[list[Any]] = []
    for r in sorted(ranges):
        versions = list(r[6 : 6 + count])
        last = out[-1] if out else None
        if last and last[:2] == list(r[:2]) and last[3] == r[2] and last[4:] == versions:
            last[3] = r[3]
        else:
            out.append([r[0], r[1], r[2], r[3], *versions])
    return [tuple(r) for r in out]


def pieces(
    ranges: list[tuple[Any, ...]], names: list[str], start: Offsets, end: Offsets
) -> list[list[Any]]:
    """The parts of ``merged`` ranges a batch [start, end) read, with the pins (of
    the enrichments ``names``) recorded there: as the ledger keeps them
    (``replayed`` in the batch row's details, each pin ``Pin.to_json``)."""
    found = []
    for topic, part, begin, stop, *versions in ranges:
        low = max(begin, start.get((topic, part), end.get((topic, part), 0)))
        high = min(stop, end.get((topic, part), low))
        if low < high:
            found.append([topic, part, low, high, dict(zip(names, versions, strict=True))])
    return found


def history(spark: SparkSession, path: str) -> list[tuple[int, int]]:
    """(version, commit time in ms) of the table's kept versions, as the stream's
    source chooses from them (``PinnedDeltaSource.versionAt``)."""
    table = "delta.`" + path.replace("`", "``") + "`"
    rows = spark.sql(f"DESCRIBE HISTORY {table}").selectExpr(
        "version", "unix_millis(timestamp) AS ms"
    )
    return sorted((int(r["version"]), int(r["ms"])) for r in rows.collect())


def version_at(versions: list[tuple[int, int]], time_ms: int) -> int | None:
    """The newest version committed at or before ``time_ms`` (the stream's rule;
    None: the table's kept history starts later)."""
    found = [v for v, ms in versions if ms <= time_ms]
    return max(found) if found else None
