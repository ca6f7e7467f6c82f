"""``python -m jobs storage``: the embedded S3 server's start, status and stop, and
the check that qualifies a store."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from jobs.local_server import find_free_port
from jobs.settings import REPO_ROOT
from jobs.storage_server import StorageInfo
from jobs.warehouse import Location


def _storage(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jobs", "storage", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_start_status_stop_and_a_restart_keeps_the_objects_and_keys(tmp_path: Path) -> None:
    data_dir, port = tmp_path / "storage", str(find_free_port(29500, 29900))
    started = _storage("start", "--data-dir", str(data_dir), "--port", port)
    try:
        assert started.returncode == 0, started.stderr
        assert f"S3 server running: http://127.0.0.1:{port}" in started.stdout
        exports = dict(
            line.removeprefix("export ").split("=", 1)
            for line in started.stdout.splitlines()
            if line.startswith("export ")
        )
        assert exports["AWS_ENDPOINT_URL"] == f"http://127.0.0.1:{port}"
        assert (data_dir / "storage.json").stat().st_mode & 0o077 == 0  # its keys: owner only
        env = {**os.environ, **exports}
        os.environ.update(exports)
        try:
            (Location.parse("s3://warehouse/kept") / "a").write_bytes(b"1")
        finally:
            for name in exports:
                os.environ.pop(name, None)
        assert _storage("status", "--data-dir", str(data_dir)).returncode == 0
        assert _storage("stop", "--data-dir", str(data_dir)).stdout.strip() == "S3 server stopped"
        assert _storage("status", "--data-dir", str(data_dir)).returncode == 1
        again = _storage("start", "--data-dir", str(data_dir), "--port", port)
        assert again.returncode == 0, again.stderr
        assert again.stdout.splitlines()[1:] == started.stdout.splitlines()[1:]  # same keys
        os.environ.update(exports)
        try:
            assert (Location.parse("s3://warehouse/kept") / "a").read_bytes() == b"1"
        finally:
            for name in exports:
                os.environ.pop(name, None)
        check = _storage(
            "check",
            "--warehouse",
            "s3://warehouse/kept",
            "--rounds",
            "1",
            "--writers",
            "4",
            env=env,
        )
        assert check.returncode == 0, check.stderr
    finally:
        _storage("stop", "--data-dir", str(data_dir))


def test_check_qualifies_the_project_s3_server(s3_server: StorageInfo) -> None:
    done = _storage(
        "check",
        "--warehouse",
        f"{s3_server.warehouse}/check",
        env={**os.environ, **s3_server.environment()},
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line[:4] for line in lines[:3]] == ["ok  "] * 3
    assert "one winner each" in lines[0] and "one winner each" in lines[1]
    assert lines[-1].endswith("the store gives every guarantee the platform needs")


def test_check_refuses_a_local_path_and_a_bad_uri(tmp_path: Path) -> None:
    local = _storage("check", "--warehouse", str(tmp_path))
    assert local.returncode == 2
    assert local.stderr.strip().splitlines()[-1].startswith("error: storage check qualifies")
    bad = _storage("check", "--warehouse", "gs://bucket/x")
    assert bad.returncode == 2 and "s3://bucket/prefix" in bad.stderr
