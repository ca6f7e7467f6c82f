"""The Delta log's size: one JSON file per commit, forever, unless something drops
the old ones. A stream at a 1 s trigger commits 86,400 times a day per table.

Delta's own rule (delta-rs writers run it after their automatic checkpoints) drops
entries older than ``delta.logRetentionDuration`` below the newest checkpoint. By
age alone that can break time travel to a version inside the retention: the
entries between the checkpoint before it and the version may be older than the
cutoff. So the platform turns that rule off for its tables and ``maintain`` drops
entries by version instead: it writes a checkpoint at the oldest version that must
stay loadable (a rewind's oldest state version; the current one for tables nothing
time-travels), then deletes the entries below it.

A load of a table reads the log from its newest checkpoint on, one object per
entry: the platform's tables are checkpointed every 10 commits (Delta-spark's
default; delta-rs' is 100), so a load costs the same however old the table is.
"""

from __future__ import annotations

import json
import logging
import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable

from jobs.warehouse import Location, Stat

log = logging.getLogger(__name__)

# Writers' age-based cleanup of log entries: off; a checkpoint every 10 commits
# (see above). ``maintain`` brings tables made before either up to date.
EXPIRED_LOG_CLEANUP = "delta.enableExpiredLogCleanup"
CHECKPOINT_INTERVAL = "delta.checkpointInterval"
TABLE_CONFIGURATION = {EXPIRED_LOG_CLEANUP: "false", CHECKPOINT_INTERVAL: "10"}
# What ``removal_stamps`` read of a table's entries, kept beside the application's
# tables: a commit entry never changes, so what it says is read once.
STAMPS_FOLDER = "_stamps"
STAMPS_SCHEMA = pa.schema([("version", pa.int64()), ("tag", pa.string()), ("stamp", pa.int64())])
# Commits, checkpoints (single or multi-part) and their checksums, by version.
ENTRY = re.compile(r"^(\d{20})\.(json|crc|checkpoint\.parquet|checkpoint\.\d+\.\d+\.parquet)$")


def commit_infos(
    table: Location, first: int = 0, last: int | None = None
) -> dict[int, dict[str, Any]]:
    """The commit info of every version from ``first`` to ``last`` (or the newest)
    whose log entry is still there, read entry by entry: exact by version whatever
    commits land meanwhile. (delta-rs 1.6's ``history()`` labels versions from the
    snapshot its table object loaded, so a commit landing after the load shifts
    every label by one.)"""
    log_dir = table / "_delta_log"
    if last is None:  # up to the newest: list the log
        found_versions = [
            int(entry.group(1))
            for path in log_dir.iterdir()
            if (entry := ENTRY.fullmatch(path.name)) and entry.group(2) == "json"
        ]
        versions = [v for v in found_versions if v >= first]
    else:
        versions = list(range(first, last + 1))
    found: dict[int, dict[str, Any]] = {}
    for version in versions:
        try:
            lines = (log_dir / f"{version:020d}.json").read_text().splitlines()
        except FileNotFoundError:  # never written, or dropped by maintain
            continue
        actions = [json.loads(line) for line in lines if line.strip()]
        found[version] = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
    return dict(sorted(found.items()))


def log_entries(table: Location) -> dict[int, Stat]:
    """Each commit entry still in the log, by version, from one listing: its time in
    the store and its version tag."""
    return {
        int(found.group(1)): stat
        for path, stat in (table / "_delta_log").files()
        if (found := ENTRY.fullmatch(path.name)) and found.group(2) == "json"
    }


def entry_times(table: Location, listed: dict[int, Stat] | None = None) -> dict[int, float]:
    """When the store received each commit entry still in the log (seconds, on the
    store's clock): the ages ``maintain`` judges by, whichever machine wrote the
    entries and whatever its clock said."""
    listed = log_entries(table) if listed is None else listed
    return {version: stat.modified_s for version, stat in listed.items()}


def stamps_cache(table: Location) -> Location:
    """Where ``removal_stamps`` keeps what it read of ``table``'s entries."""
    return table.parent / STAMPS_FOLDER / f"{table.name}.parquet"


def removal_stamps(
    table: Location, first: int, listed: dict[int, Stat] | None = None
) -> dict[int, int]:
    """For each commit entry from version ``first`` on: the earliest time its
    writer stamped on it (milliseconds, the writer's clock), its commit info's or
    a removed file's ``deletionTimestamp``. Delta's vacuum compares exactly these
    stamps with its own clock, so a retention computed from them keeps what it
    must whatever the writers' clocks say.

    An entry is read once: on S3, what was read is kept beside the table
    (``stamps_cache``), by version and the entry's version tag, and used again only
    for the very same entry (a table made anew has other tags). A busy table's log
    holds hundreds of thousands of entries (a 1 s trigger, a 7-day horizon); each
    ``maintain`` then reads only those committed since the last. The rest are read
    several at once; an entry dropped meanwhile is left out."""
    listed = log_entries(table) if listed is None else listed
    tags = {v: stat.etag for v, stat in listed.items() if stat.etag}
    cached = _read_stamps(table) if tags else {}
    found: dict[int, int | None] = {
        v: cached[v][1]
        for v in listed
        if v >= first and v in cached and cached[v][0] == tags.get(v)
    }
    missing = [v for v in listed if v >= first and v not in found]

    def earliest(version: int) -> tuple[int, int | None, bool]:
        try:
            text = (table / "_delta_log" / f"{version:020d}.json").read_text()
        except FileNotFoundError:  # dropped by another maintain since the listing
            return version, None, False
        stamps = []
        for line in text.splitlines():
            if not line.strip():
                continue
            action = json.loads(line)
            if "commitInfo" in action and "timestamp" in action["commitInfo"]:
                stamps.append(int(action["commitInfo"]["timestamp"]))
            if "remove" in action and action["remove"].get("deletionTimestamp") is not None:
                stamps.append(int(action["remove"]["deletionTimestamp"]))
        return version, min(stamps) if stamps else None, True

    read: dict[int, int | None] = {}
    with ThreadPoolExecutor(max_workers=16) as pool:
        for version, stamp, there in pool.map(earliest, missing):
            if there:
                read[version] = stamp
    found.update(read)
    if read and tags:
        keep = {v: entry for v, entry in cached.items() if tags.get(v) == entry[0]}
        keep.update({v: (tags[v], stamp) for v, stamp in read.items() if v in tags})
        _write_stamps(table, keep)
    return {v: stamp for v, stamp in sorted(found.items()) if stamp is not None}


def _read_stamps(table: Location) -> dict[int, tuple[str, int | None]]:
    """The cache of ``table``'s stamps ({} when there is none or it cannot be used:
    it is only ever a shortcut)."""
    at = stamps_cache(table)
    try:
        rows = pq.read_table(pa.BufferReader(at.read_bytes()))
        if rows.schema != STAMPS_SCHEMA:
            raise ValueError(f"columns {rows.schema.names}")
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, pa.ArrowException) as exc:
        log.warning("%s: not a cache of removal stamps (%s): the log is read instead", at, exc)
        return {}
    columns = rows.to_pydict()
    return {
        v: (tag, stamp)
        for v, tag, stamp in zip(columns["version"], columns["tag"], columns["stamp"], strict=True)
    }


def _write_stamps(table: Location, entries: dict[int, tuple[str, int | None]]) -> None:
    versions = sorted(entries)
    rows = pa.table(
        {
            "version": versions,
            "tag": [entries[v][0] for v in versions],
            "stamp": [entries[v][1] for v in versions],
        },
        schema=STAMPS_SCHEMA,
    )
    sink = pa.BufferOutputStream()
    pq.write_table(rows, sink, compression="zstd")
    stamps_cache(table).write_bytes(sink.getvalue().to_pybytes())


def checkpoint_file(table: Location, version: int) -> Location:
    return table / "_delta_log" / f"{version:020d}.checkpoint.parquet"


def keep_loadable_from(
    table: Location, floor: int, grace_s: float, now_s: float | None = None
) -> int:
    """Make every version from ``floor`` on loadable without the entries below it,
    then delete the entries below the newest checkpoint at or under ``floor`` that
    is older than ``grace_s`` (and older than that themselves): a reader or writer
    that loaded the table a moment ago still finds the checkpoint it started from
    and every entry after it. A checkpoint written now serves the next maintain.
    Returns the number of files deleted."""
    uri = str(table)
    current = DeltaTable(uri).version()
    if not 0 <= floor <= current:
        raise ValueError(f"{table}: version {floor} is not between 0 and {current}")
    if floor < current and checkpoint_file(table, floor).stat() is None:
        DeltaTable(uri, version=floor).create_checkpoint()
    # Last: readers start from the newest checkpoint (_last_checkpoint names it).
    DeltaTable(uri).create_checkpoint()
    listed = (table / "_delta_log").files()
    if now_s is None:
        # The store's clock, which the entries' times are on (never this machine's
        # clock against the store's): the newest object it holds in the log, written
        # a moment ago (a checkpoint above), is at most its now.
        now_s = max((stat.modified_s for _path, stat in listed), default=time.time())
    cutoff = now_s - grace_s
    entries = [
        (int(found.group(1)), found.group(2), path, stat.modified_s)
        for path, stat in listed
        if (found := ENTRY.fullmatch(path.name))
    ]
    settled = [
        version
        for version, kind, _path, modified_s in entries
        if kind.startswith("checkpoint") and version <= floor and modified_s <= cutoff
    ]
    if not settled:
        log.info("%s: no checkpoint at or below version %d is settled yet", table.name, floor)
        return 0
    below = max(settled)
    deleted = 0
    for version, _kind, path, modified_s in entries:
        if version < below and modified_s <= cutoff:
            path.delete()
            deleted += 1
    return deleted
