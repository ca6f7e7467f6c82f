"""The store check fails a store whose conditional writes race (as S3Proxy's and
moto's do), and passes one whose writes are atomic."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from jobs import storage_check, warehouse
from jobs.warehouse import AlreadyExistsError, Location, Stat


def test_an_atomic_create_passes(tmp_path: Path) -> None:
    found = storage_check.create_is_atomic(Location.local_path(tmp_path), rounds=3, writers=8)
    assert found.passed, found.detail


def test_a_create_that_checks_then_writes_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def racy_create(self: object, loc: Location, data: bytes) -> Stat:
        if loc.path.exists():
            raise AlreadyExistsError(f"{loc} exists already")
        time.sleep(0.05)  # another writer's check passes meanwhile
        loc.path.parent.mkdir(parents=True, exist_ok=True)
        loc.path.write_bytes(data)
        return Stat(len(data), time.time(), None)

    monkeypatch.setattr(warehouse._LocalFiles, "create", racy_create)
    found = storage_check.create_is_atomic(Location.local_path(tmp_path), rounds=2, writers=8)
    assert not found.passed and "winners" in found.detail


def test_a_listing_that_shows_temporary_files_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def leaky_write(self: object, loc: Location, data: bytes) -> None:
        tmp = loc.path.parent / f"{loc.name}.part"
        tmp.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(data)
        time.sleep(0.01)
        tmp.rename(loc.path)

    monkeypatch.setattr(warehouse._LocalFiles, "write", leaky_write)
    found = storage_check.listing_is_consistent(Location.local_path(tmp_path), 60, 4)
    assert not found.passed and "which no writer wrote" in found.detail
