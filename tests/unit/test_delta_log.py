"""The Delta log rule of ``maintain`` (jobs/delta/log.py), on real delta-rs tables."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from jobs.delta.log import TABLE_CONFIGURATION, keep_loadable_from, removal_stamps, stamps_cache
from jobs.storage_server import StorageInfo
from jobs.warehouse import Location
from tests.s3_proxy import StoreProxy


def commits(path: Path, count: int, configuration: dict[str, str] | None = None) -> None:
    for i in range(count):
        write_deltalake(
            str(path),
            pa.table({"n": [i]}),
            mode="append",
            configuration=configuration if i == 0 else None,
        )


def log_versions(path: Path, suffix: str = ".json") -> list[int]:
    return sorted(int(p.name[:20]) for p in (path / "_delta_log").glob(f"*{suffix}"))


def test_every_version_from_the_floor_stays_loadable(tmp_path: Path) -> None:
    table = tmp_path / "t"
    commits(table, 12)
    deleted = keep_loadable_from(Location.local_path(table), 5, grace_s=0)
    assert deleted == 5  # commits 0-4
    assert log_versions(table) == list(range(5, 12))
    for version in range(5, 12):
        assert DeltaTable(str(table), version=version).to_pyarrow_table().num_rows == version + 1
    with pytest.raises(Exception):  # noqa: B017 - delta-rs raises its own kinds
        DeltaTable(str(table), version=4)
    # Readers start from the newest checkpoint.
    assert '"version":11' in (table / "_delta_log" / "_last_checkpoint").read_text()


def test_only_entries_below_a_settled_checkpoint_go(tmp_path: Path) -> None:
    """With a grace, the checkpoint written now is not used yet (a writer may have
    loaded from an older one a moment ago): an old one is, if there is one."""
    table = tmp_path / "t"
    commits(table, 6)
    assert keep_loadable_from(Location.local_path(table), 4, grace_s=3600) == 0  # none settled
    DeltaTable(str(table), version=2).create_checkpoint()
    old = time.time() - 7200
    for name in ("00000000000000000000.json", "00000000000000000001.json"):
        os.utime(table / "_delta_log" / name, (old, old))
    os.utime(table / "_delta_log" / "00000000000000000002.checkpoint.parquet", (old, old))
    assert keep_loadable_from(Location.local_path(table), 4, grace_s=3600) == 2
    assert log_versions(table) == [2, 3, 4, 5]
    for version in range(2, 6):
        assert DeltaTable(str(table), version=version).to_pyarrow_table().num_rows == version + 1


def test_a_floor_outside_the_table_is_refused(tmp_path: Path) -> None:
    table = tmp_path / "t"
    commits(table, 2)
    with pytest.raises(ValueError, match="not between 0 and 1"):
        keep_loadable_from(Location.local_path(table), 2, grace_s=0)


def test_writers_never_drop_entries_by_age_on_platform_tables(tmp_path: Path) -> None:
    """delta-rs writers checkpoint every ``checkpointInterval`` commits and then drop
    entries older than the log retention: with the platform's setting they keep them."""
    aggressive = {
        "delta.checkpointInterval": "2",
        "delta.logRetentionDuration": "interval 1 seconds",
    }
    for name, configuration in (
        ("default", aggressive),
        ("platform", {**TABLE_CONFIGURATION, **aggressive}),
    ):
        commits(tmp_path / name, 1, configuration)
        time.sleep(1.2)
        commits(tmp_path / name, 4)
    assert log_versions(tmp_path / "default")[0] > 0  # the check can fail: Delta's rule ran
    assert log_versions(tmp_path / "platform") == list(range(5))


def test_a_platform_table_is_checkpointed_every_ten_commits(tmp_path: Path) -> None:
    """A load reads the log from the newest checkpoint on: however old the table, a
    load reads at most ten entries (delta-rs' default is a checkpoint every 100
    commits, so each load of a busy table read up to 100 objects)."""
    commits(tmp_path / "t", 25, dict(TABLE_CONFIGURATION))
    # after the 10th and the 20th commit
    assert log_versions(tmp_path / "t", ".checkpoint.parquet") == [9, 19]


def test_commit_infos_are_exact_by_version_when_commits_land_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deltalake import CommitProperties

    from jobs.delta.writer import find_commit_version
    from jobs.output.changes import commit_infos

    def commit(n: int) -> None:
        tags = {"n": str(n), "application_id": "a", "epoch": "0", "batch_id": str(n)}
        write_deltalake(
            str(tmp_path),
            pa.table({"n": [n]}),
            mode="append",
            commit_properties=CommitProperties(custom_metadata=tags),
        )

    for n in range(4):
        commit(n)  # version n carries n
    # delta-rs 1.6 labels history() from the snapshot the table object loaded: a
    # commit landing after the load shifts every version by one.
    loaded = DeltaTable(str(tmp_path))
    commit(4)
    assert {e["version"]: e.get("n") for e in loaded.history()}[3] == "4"

    # A concurrent writer commits between a reader's load and its history read.
    original = DeltaTable.history
    next_commit = [5]

    def racing_history(self: DeltaTable, limit: int | None = None) -> list[dict[str, object]]:
        commit(next_commit[0])
        next_commit[0] += 1
        return original(self, limit)

    monkeypatch.setattr(DeltaTable, "history", racing_history)
    assert {v: i["n"] for v, i in commit_infos(Location.local_path(tmp_path), 2, 4).items()} == {
        2: "2",
        3: "3",
        4: "4",
    }
    assert find_commit_version(tmp_path, "a", 0, 3, limit=10) == 3


def test_what_is_settled_is_judged_on_the_stores_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The entries' times are the store's; this machine's clock runs two hours
    ahead of it: nothing written a moment ago is settled (a reader that loaded the
    table a moment ago still finds what it started from)."""
    from jobs.delta import log

    table = tmp_path / "t"
    commits(table, 6)
    DeltaTable(str(table), version=2).create_checkpoint()
    ahead = time.time() + 7200
    monkeypatch.setattr(log.time, "time", lambda: ahead)
    assert keep_loadable_from(Location.local_path(table), 4, grace_s=3600) == 0
    assert log_versions(table)[0] == 0


def test_a_floor_checkpoint_written_after_the_newest_one_is_settled_at_once(
    tmp_path: Path,
) -> None:
    """The newest version's checkpoint was written already (delta-rs writes one every
    10 commits), so this call writes only the floor's, later than _last_checkpoint:
    the store's now is the newest object in the log, and with no grace the floor's
    checkpoint is settled (found flaky in test_maintain when the table stood at
    version 9)."""
    table = tmp_path / "t"
    commits(table, 10)
    DeltaTable(str(table)).create_checkpoint()
    time.sleep(0.05)
    assert keep_loadable_from(Location.local_path(table), 4, grace_s=0) == 4
    assert log_versions(table)[0] == 4


def test_each_entry_is_read_once_and_a_table_made_anew_is_read_again(
    s3_server: StorageInfo, s3_warehouse: Location, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``removal_stamps`` keeps what it read (on S3, by each entry's version tag): a
    later call reads only the entries committed since, a table deleted and made anew
    is read again, and every answer equals a read of the whole log with no cache."""
    table = s3_warehouse / "state"

    def overwrite(count: int) -> None:  # each commit after the first removes a file
        for i in range(count):
            write_deltalake(str(table), pa.table({"n": [i]}), mode="overwrite")

    def uncached() -> dict[int, int]:
        stamps_cache(table).delete()
        return removal_stamps(table, 0)

    with StoreProxy(s3_server.port) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)

        def entries_read(first: int) -> tuple[dict[int, int], int]:
            before = proxy.shapes["GET state/_delta_log/#.json"]
            found = removal_stamps(table, first)
            return found, proxy.shapes["GET state/_delta_log/#.json"] - before

        overwrite(6)
        first, reads = entries_read(0)
        assert (sorted(first), reads) == (list(range(6)), 6)
        overwrite(2)
        again, reads = entries_read(0)
        assert reads == 2  # only the new ones
        assert entries_read(3) == ({v: s for v, s in again.items() if v >= 3}, 0)
        assert {v: s for v, s in again.items() if v < 6} == first
        assert again == uncached()

        table.delete_tree()  # made anew: versions 0-2 again, other entries
        overwrite(3)
        made_anew, reads = entries_read(0)
        assert reads == 3
        assert made_anew == uncached() and sorted(made_anew) == [0, 1, 2]
        assert made_anew != {v: s for v, s in first.items() if v < 3}
