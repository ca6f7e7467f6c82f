"""``python -m jobs storage check --warehouse s3://...``: does a store give what the
platform needs? It races writers against it and refuses a store that fails:

* ``If-None-Match: *`` is atomic: of writers racing to create one object, exactly
  one wins (Delta's commits, cuts and leases depend on it);
* ``If-Match: <etag>`` is atomic: of writers racing to replace one version, exactly
  one wins (the lease's renewal and takeover);
* listings are consistent: every object written is listed once it is written,
  and nothing half-written or temporary ever is (Delta's log, maintain, status).

Everything it writes is under ``<warehouse>/_storage_check/<random>/``, removed at
the end.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from jobs.errors import ConfigError
from jobs.warehouse import AlreadyExistsError, ChangedError, Location, StorageError

CHECK_FOLDER = "_storage_check"


@dataclass(frozen=True)
class Finding:
    name: str
    passed: bool
    detail: str


def _race(writers: int, attempt: Callable[[int], bool]) -> int:
    """How many of ``writers`` threads, released together, succeeded."""
    gate = threading.Barrier(writers)

    def run(i: int) -> bool:
        gate.wait()
        return attempt(i)

    with ThreadPoolExecutor(writers) as pool:
        return sum(pool.map(run, range(writers)))


def _one_winner_each(
    name: str, rounds: int, writers: int, attempt_of: Callable[[int], Callable[[int], bool]]
) -> Finding:
    """``rounds`` races of ``writers`` (``attempt_of(round)``): exactly one wins each."""
    bad = []
    for r in range(rounds):
        winners = _race(writers, attempt_of(r))
        if winners != 1:
            bad.append(f"round {r}: {winners} winners")
    detail = "; ".join(bad) or f"{rounds} rounds of {writers} writers: one winner each"
    return Finding(name, not bad, detail)


def create_is_atomic(folder: Location, rounds: int, writers: int) -> Finding:
    def attempt_of(r: int) -> Callable[[int], bool]:
        target = folder / f"create-{r}"

        def attempt(i: int) -> bool:
            try:
                target.create(f"writer {i}".encode())
            except AlreadyExistsError:
                return False
            return True

        return attempt

    return _one_winner_each("If-None-Match: * (create only if absent)", rounds, writers, attempt_of)


def update_is_atomic(folder: Location, rounds: int, writers: int) -> Finding:
    def attempt_of(r: int) -> Callable[[int], bool]:
        target = folder / f"update-{r}"
        etag = target.create(b"first").etag
        if etag is None:
            raise StorageError(f"the store of {folder} returned no version tag (ETag)")

        def attempt(i: int) -> bool:
            try:
                target.update(f"writer {i} {uuid.uuid4().hex}".encode(), etag)
            except ChangedError:
                return False
            return True

        return attempt

    name = "If-Match: <etag> (replace only that version)"
    try:
        return _one_winner_each(name, rounds, writers, attempt_of)
    except StorageError as exc:
        return Finding(name, False, str(exc))


def listing_is_consistent(folder: Location, objects: int, writers: int) -> Finding:
    """Writers put ``objects`` objects while a reader lists: every listing holds
    only whole objects written, and the last holds all of them."""
    listed = folder / "listed"
    expected = {f"object-{i:05d}": f"content {i}".encode() for i in range(objects)}
    problems: list[str] = []
    done = threading.Event()

    def lister() -> None:
        try:
            while not done.is_set():
                for child in listed.iterdir():
                    if child.name not in expected:
                        problems.append(f"listed {child.name}, which no writer wrote")
                        return
        except Exception as exc:  # a listing that fails under writes fails the check
            problems.append(f"a listing failed while writers ran: {exc}")

    watcher = threading.Thread(target=lister)
    watcher.start()
    names = sorted(expected)
    with ThreadPoolExecutor(writers) as pool:
        list(pool.map(lambda n: (listed / n).write_bytes(expected[n]), names))
    done.set()
    watcher.join()
    found = {child.name for child in listed.iterdir()}
    if found != set(expected):
        problems.append(f"after the writes the listing has {len(found)} of {len(expected)}")
    elif any((listed / n).read_bytes() != expected[n] for n in names[:: max(1, objects // 20)]):
        problems.append("an object listed reads back other bytes than were written")
    detail = "; ".join(problems) or f"{objects} objects by {writers} writers, listed while written"
    return Finding("listing after writes", not problems, detail)


def check(warehouse: Location, rounds: int = 10, writers: int = 8) -> list[Finding]:
    """Every finding for ``warehouse`` (an S3 location)."""
    if not warehouse.is_s3:
        raise ConfigError(
            f"storage check qualifies an object store: {warehouse} is a local path "
            "(give --warehouse s3://bucket/prefix)"
        )
    folder = warehouse / CHECK_FOLDER / uuid.uuid4().hex[:12]
    try:
        return [
            create_is_atomic(folder, rounds, writers),
            update_is_atomic(folder, rounds, writers),
            listing_is_consistent(folder, 200, writers),
        ]
    finally:
        folder.delete_tree()
