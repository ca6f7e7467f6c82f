"""One holder per application across machines: a lease object in the warehouse.

A warehouse on S3 has no locks, and the drivers, Airflow workers and users'
shells that run an application share nothing but the store. The lease is one
object, ``<app>/_lease``, holding who has it (purpose, pid, host, user), its
time to live and a generation:

* **take**: ``create`` it (``If-None-Match: *``): exactly one taker wins.
* **renew**: every ``ttl / 4``, replace it only if it is still the version this
  holder wrote (``If-Match: <etag>``). A renewal that finds another version has
  lost the lease: the holder stops (``check`` raises).
* **take over**: a lease not renewed for a whole ``ttl`` is expired. Expiry is
  judged on the taker's own clock only: it watches the object's version for
  ``ttl`` seconds, and takes it over (``If-Match``, generation + 1) only if no
  renewal came. No two machines' clocks are compared. A lease that looks fresh
  by its record's time is busy at once, without the watch.
* **release**: replace it (``If-Match``) with a released record, which the next
  taker takes over at once.

A holder stops committing before its lease could expire: ``check`` refuses once
``ttl * SAFE_FRACTION`` has passed on its monotonic clock since its last
successful renewal started. A process frozen (SIGSTOP, a long GC pause, a
suspended VM) past that finds on waking that it may commit nothing. The
generation is the fencing token a commit can carry for the rest of the window.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from jobs.errors import PlatformError
from jobs.warehouse import AlreadyExistsError, ChangedError, Location, Stat, StorageError

log = logging.getLogger(__name__)

LEASE = "_lease"
DEFAULT_TTL_S = 30.0
# A holder commits nothing after this much of its lease has passed unrenewed: the
# rest covers the difference in rate between two machines' clocks and a commit
# that started just before.
SAFE_FRACTION = 0.75
RENEWALS_PER_TTL = 4


class LeaseError(PlatformError):
    """The application's lease is held by another, or this holder lost it."""


class LeaseLostError(LeaseError):
    """This holder may not commit any more: its lease expired or was taken over."""


@dataclass
class Lease:
    """A held lease; ``check`` before every commit."""

    location: Location
    holder: dict[str, Any]
    ttl_s: float
    etag: str
    generation: int
    _renewed_at: float = field(default_factory=time.monotonic)
    _lost: str | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def check(self) -> None:
        """Raise LeaseLostError when this holder may no longer commit."""
        with self._lock:
            lost, renewed_at = self._lost, self._renewed_at
        if lost is not None:
            raise LeaseLostError(lost)
        idle = time.monotonic() - renewed_at
        if idle > self.ttl_s * SAFE_FRACTION:
            raise LeaseLostError(
                f"the lease on {self.location.parent.name} went {idle:.0f} s without a renewal "
                f"(this process was paused or the store unreachable; the lease lasts "
                f"{self.ttl_s:.0f} s): another holder may run the application now, so this one "
                "commits nothing more; run it again to take the lease back once it is free"
            )

    def renew(self) -> None:
        """Replace the lease with a fresh record if it is still ours."""
        started = time.monotonic()
        record = {**self.holder, "renewed_s": time.time(), "generation": self.generation}
        try:
            written = self.location.update(_encode(record, self.ttl_s), self.etag)
        except ChangedError:
            with self._lock:
                self._lost = (
                    f"the lease on {self.location.parent.name} was taken over by another "
                    f"holder ({describe(_read(self.location)[0])}) after this one went "
                    "unrenewed: this process commits nothing more"
                )
            return
        with self._lock:
            self.etag = written.etag or self.etag
            self._renewed_at = started

    def _keep_renewing(self) -> None:
        while not self._stop.wait(self.ttl_s / RENEWALS_PER_TTL):
            if self._lost is not None:
                return
            try:
                self.renew()
            except StorageError as exc:  # the store is down: retried at the next turn
                log.warning("could not renew the lease %s: %s", self.location, exc)

    def release(self) -> None:
        """Hand the lease back (the next taker has it at once); a second call, or one
        after the lease was lost, does nothing."""
        self._stop.set()
        with self._lock:
            if self._lost is not None:
                return
            self._lost = f"the lease on {self.location.parent.name} was released"
        record = {**self.holder, "released": True, "generation": self.generation}
        try:
            self.location.update(_encode(record, self.ttl_s), self.etag)
        except (ChangedError, StorageError) as exc:
            log.warning("could not release the lease %s: %s", self.location, exc)


def _encode(record: dict[str, Any], ttl_s: float) -> bytes:
    # Unique every time: a store's version tag is often the content's MD5, and two
    # holders must never write the same bytes.
    return json.dumps({**record, "ttl_s": ttl_s, "write": uuid.uuid4().hex}).encode()


def _read(location: Location) -> tuple[dict[str, Any], Stat | None]:
    stat = location.stat()
    if stat is None:
        return {}, None
    try:
        record = json.loads(location.read_bytes())
    except FileNotFoundError:
        return {}, None
    except ValueError:
        record = {}
    return (record if isinstance(record, dict) else {}), stat


def describe(record: dict[str, Any]) -> str:
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(record.get("since", 0)))
    return (
        f"{record.get('purpose', 'unknown')} (pid {record.get('pid', '?')} on "
        f"{record.get('host', '?')}, user {record.get('user', '?')}, since {since})"
    )


def holder_record(purpose: str, user: str) -> dict[str, Any]:
    return {
        "purpose": purpose,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "user": user,
        "since": time.time(),
        "holder": uuid.uuid4().hex,
    }


def current(location: Location) -> dict[str, Any] | None:
    """The lease's holder now (its record), or None when it is free. A lease whose
    record is older than its time to live counts as held: only a taker's watch
    can tell it expired."""
    record, stat = _read(location)
    if stat is None or record.get("released"):
        return None
    return record


def take(location: Location, purpose: str, user: str, ttl_s: float = DEFAULT_TTL_S) -> Lease:
    """Take the lease at ``location`` or raise LeaseError naming its holder."""
    if ttl_s <= 0:
        raise ValueError(f"a lease lasts more than 0 s, not {ttl_s}")
    record = holder_record(purpose, user)
    try:
        created = location.create(_encode({**record, "generation": 1}, ttl_s))
        return _held(location, record, ttl_s, created, 1)
    except AlreadyExistsError:
        pass
    found, stat = _read(location)
    if stat is None or stat.etag is None:  # released and deleted by hand meanwhile
        raise LeaseError(f"the lease {location} changed while taking it: try again")
    generation = int(found.get("generation", 0)) + 1
    if not found.get("released"):
        age = time.time() - float(found.get("renewed_s", found.get("since", 0)))
        their_ttl = float(found.get("ttl_s", ttl_s))
        if age < their_ttl:
            raise LeaseError(
                f"application {location.parent.name} is busy: held by {describe(found)}, "
                f"renewed {max(age, 0):.0f} s ago; if that process is gone, its lease expires "
                f"{their_ttl:.0f} s after its last renewal: try again then"
            )
        # Stale by its writer's clock: prove it on ours, by watching for a renewal.
        deadline = time.monotonic() + their_ttl
        while time.monotonic() < deadline:
            now = location.stat()
            if now is None or now.etag != stat.etag:
                raise LeaseError(
                    f"application {location.parent.name} is busy: its lease was renewed "
                    "while this taker waited for it to expire"
                )
            time.sleep(min(1.0, their_ttl / 10))
    try:
        taken = location.update(_encode({**record, "generation": generation}, ttl_s), stat.etag)
    except ChangedError:
        raise LeaseError(
            f"application {location.parent.name} is busy: another holder took its lease first"
        ) from None
    return _held(location, record, ttl_s, taken, generation)


def _held(location: Location, record: dict[str, Any], ttl_s: float, stat: Stat, gen: int) -> Lease:
    assert stat.etag is not None, "a lease needs a store with version tags"
    lease = Lease(location, record, ttl_s, stat.etag, gen)
    threading.Thread(target=lease._keep_renewing, name="lease-renewal", daemon=True).start()
    return lease


@contextmanager
def holding(
    location: Location, purpose: str, user: str, ttl_s: float = DEFAULT_TTL_S
) -> Iterator[Lease]:
    """Hold the lease for the block; release it at the end."""
    lease = take(location, purpose, user, ttl_s)
    try:
        yield lease
    finally:
        lease.release()
