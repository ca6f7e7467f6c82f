"""No secret in any process's arguments: the store's keys reach Spark's JVM and its
executors through the environment and Spark's own RPC, never a command line that
any local user can read with ``ps``."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.storage_server import StorageInfo

pytestmark = pytest.mark.integration


def command_lines() -> dict[int, str]:
    """Every process's arguments, as ``ps`` shows them to any user."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found[int(entry.name)] = (entry / "cmdline").read_bytes().decode(errors="replace")
            except OSError:  # it ended meanwhile
                continue
    return found


def test_the_store_keys_are_in_no_process_arguments_while_a_session_runs(  # type: ignore[no-untyped-def]
    spark, s3_server: StorageInfo, s3_warehouse
) -> None:
    # The session reaches the store with the keys (a Delta table written and read on
    # S3A), so they are in use, not missing.
    table = s3_warehouse / "keys"
    spark.range(5).write.format("delta").save(table.spark_uri)
    assert spark.read.format("delta").load(table.spark_uri).count() == 5
    leaking = {
        pid: line[:200]
        for pid, line in command_lines().items()
        if s3_server.secret_key in line or s3_server.access_key in line
    }
    assert not leaking, f"the store's keys stand in these processes' arguments: {leaking}"
