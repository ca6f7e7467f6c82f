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
  renewal came. Safety never rests on two machines' clocks agreeing: a record's
  time only decides whether a taker refuses at once (it looks fresh) or watches.
* **release**: replace it (``If-Match``) with a released record, which the next
  taker takes over at once.
* **advance**: a holder whose generation is not past the token a table recorded
  (the object was deleted or lost, so generations began again at 1) replaces it
  (``If-Match``) with a generation past that token: ``advance_past``.

A holder stops committing before its lease could expire: ``check`` refuses once
``ttl * SAFE_FRACTION`` has passed on its clock (one that counts a suspend too) since its last
successful renewal started. A process frozen (SIGSTOP, a long GC pause, a
suspended VM) past that finds on waking that it may commit nothing. The
generation is the fencing token a commit can carry for the rest of the window.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from jobs.errors import LeaseError, LeaseLostError
from jobs.warehouse import AlreadyExistsError, ChangedError, Location, Stat, StorageError

log = logging.getLogger(__name__)
__all__ = ["Lease", "LeaseError", "LeaseLostError", "holding", "take"]

LEASE = "_lease"
DEFAULT_TTL_S = 30.0
# A lease's time to live, and the bounds a taker reads another's record within.
MIN_TTL_S, MAX_TTL_S = 1.0, 600.0
# A holder commits nothing after this much of its lease has passed unrenewed: the
# rest covers the difference in rate between two machines' clocks and a commit
# that started just before.
SAFE_FRACTION = 0.75
RENEWALS_PER_TTL = 4
# S3 gives an object's time to the second: two of them differ by up to this much more.
STORE_TIME_GRAIN_S = 1.0


def _clock() -> float:
    """Seconds on this machine's clock that counts a suspend too (Linux's boot
    time; a monotonic clock elsewhere): a host asleep past the lease wakes late."""
    return (
        time.clock_gettime(time.CLOCK_BOOTTIME)
        if hasattr(time, "CLOCK_BOOTTIME")
        else time.monotonic()
    )


def checked_ttl(ttl_s: float) -> float:
    if not (math.isfinite(ttl_s) and MIN_TTL_S <= ttl_s <= MAX_TTL_S):
        raise ValueError(f"a lease lasts {MIN_TTL_S:.0f}-{MAX_TTL_S:.0f} s, not {ttl_s}")
    return ttl_s


@dataclass
class Lease:
    """A held lease; ``check`` before every commit."""

    location: Location
    holder: dict[str, Any]
    ttl_s: float
    etag: str
    generation: int
    _renewed_at: float  # _clock() when the write that gave this version started
    _lost: str | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    # One write of the record at a time (a renewal, an advance): each goes on from
    # the version and generation the one before left.
    _writing: threading.Lock = field(default_factory=threading.Lock)
    _renewer: threading.Thread | None = None

    def check(self) -> None:
        """Raise LeaseLostError when this holder may no longer commit."""
        with self._lock:
            lost, renewed_at = self._lost, self._renewed_at
        if lost is not None:
            raise LeaseLostError(lost)
        idle = _clock() - renewed_at
        if idle > self.ttl_s * SAFE_FRACTION:
            raise LeaseLostError(
                f"the lease on {subject(self.location)} went {idle:.0f} s without a renewal "
                f"(this process was paused or the store unreachable; the lease lasts "
                f"{self.ttl_s:.0f} s): another holder may take it over now, so this one "
                "commits nothing more; run it again to take the lease back once it is free"
            )

    def renew(self) -> None:
        """Replace the lease with a fresh record if it is still ours."""
        with self._writing:
            started = _clock()
            with self._lock:
                etag = self.etag
            record = {**self.holder, "renewed_s": time.time(), "generation": self.generation}
            for adopted in (False, True):
                try:
                    written = self.location.update(_encode(record, self.ttl_s), etag)
                    break
                except ChangedError:
                    found, stat = _read(self.location)  # outside the lock: a network call
                    if adopted or stat is None or not stat.etag or not self._is_own(found):
                        taker = describe(found)
                        with self._lock:
                            self._lost = (
                                f"the lease on {subject(self.location)} was taken over by "
                                f"another holder ({taker}) after this one went unrenewed: this "
                                "process commits nothing more"
                            )
                        return
                    # An earlier write of ours whose answer was lost (a timeout while the
                    # store was frozen, applied when it resumed): go on from its version.
                    etag = stat.etag
            with self._lock:
                self.etag = written.etag or etag
                self._renewed_at = started

    def advance_past(self, recorded: int) -> int:
        """The generation, raised above ``recorded`` (a token a table recorded from an
        earlier lease: this lease object was deleted or lost, and generations began
        again at 1) when it is not already; LeaseLostError when another holder has the
        lease. The record is replaced ``If-Match`` on the version this holder holds,
        so only the current holder advances, and a later taker goes on from the new
        generation, never below what the table recorded."""
        with self._writing:
            if self.generation > recorded:
                return self.generation
            self.check()
            with self._lock:
                etag = self.etag
            generation = recorded + 1
            started = _clock()
            record = {**self.holder, "renewed_s": time.time(), "generation": generation}
            for adopted in (False, True):
                try:
                    written = self.location.update(_encode(record, self.ttl_s), etag)
                    break
                except ChangedError:
                    found, stat = _read(self.location)
                    if stat is not None and stat.etag and self._is_own(found, generation):
                        # This advance went through although its answer was lost.
                        written = stat
                        break
                    if adopted or stat is None or not stat.etag or not self._is_own(found):
                        lost = (
                            f"the lease on {subject(self.location)} was taken over by another "
                            f"holder ({describe(found)}) while this one held generation "
                            f"{self.generation}: this process commits nothing more"
                        )
                        with self._lock:
                            self._lost = lost
                        raise LeaseLostError(lost) from None
                    # A renewal of ours whose answer was lost: go on from its version.
                    etag = stat.etag
            log.warning(
                "the lease on %s was at generation %d, not past the %d a table recorded "
                "(its lease object was deleted or lost): advanced to %d",
                subject(self.location),
                self.generation,
                recorded,
                generation,
            )
            with self._lock:
                self.etag = written.etag or etag
                self.generation = generation
                self._renewed_at = started
            return generation

    def _keep_renewing(self) -> None:
        while not self._stop.wait(self.ttl_s / RENEWALS_PER_TTL):
            if self._lost is not None:
                return
            try:
                self.renew()
            except StorageError as exc:  # the store is down: retried at the next turn
                log.warning("could not renew the lease %s: %s", self.location, exc)

    def start_renewing(self) -> None:
        self._renewer = threading.Thread(
            target=self._keep_renewing, name="lease-renewal", daemon=True
        )
        self._renewer.start()

    def release(self) -> None:
        """Hand the lease back (the next taker has it at once); a second call, or one
        after the lease was lost, does nothing."""
        self._stop.set()
        if self._renewer is not None:
            # A renewal under way would change the version the release replaces.
            self._renewer.join(self.ttl_s)
        with self._lock:
            if self._lost is not None:
                return
            self._lost = f"the lease on {subject(self.location)} was released"
            etag = self.etag
        record = {**self.holder, "released": True, "generation": self.generation}
        try:
            try:
                self.location.update(_encode(record, self.ttl_s), etag)
            except ChangedError:
                found, stat = _read(self.location)
                if found.get("holder") == self.holder["holder"] and found.get("released"):
                    return  # this release went through although its answer was lost
                if stat is None or not stat.etag or not self._is_own(found):
                    raise
                # Our own write whose answer was lost: still ours to hand back.
                self.location.update(_encode(record, self.ttl_s), stat.etag)
        except (ChangedError, StorageError) as exc:
            log.warning("could not release the lease %s: %s", self.location, exc)

    def _is_own(self, found: dict[str, Any], generation: int | None = None) -> bool:
        """``found`` is a record this holder wrote (its id, unreleased, its generation,
        or ``generation``: one it is advancing to)."""
        return (
            found.get("holder") == self.holder["holder"]
            and not found.get("released")
            and found.get("generation") == (self.generation if generation is None else generation)
        )


def _encode(record: dict[str, Any], ttl_s: float) -> bytes:
    # Unique every time: a store's version tag is often the content's MD5, and two
    # holders must never write the same bytes.
    return json.dumps({**record, "ttl_s": ttl_s, "write": uuid.uuid4().hex}).encode()


def _read(location: Location) -> tuple[dict[str, Any], Stat | None]:
    """The record ({} when it is not a JSON object) and its version, or ({}, None)."""
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


def _number(record: dict[str, Any], name: str) -> float | None:
    """A finite number field of a record someone else wrote, or None."""
    value = record.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def describe(record: dict[str, Any]) -> str:
    when = _number(record, "since")
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(when)) if when else "?"
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
    """The lease's holder now (its record; ``{"purpose": "unknown"}`` when it cannot
    be read), or None when it holds nothing: it is released, or the store has kept it
    unrenewed for longer than its time to live (a killed holder). What commands check
    before they start and ``status`` shows. The age is the store's alone (the
    object's time against the store's now, ``Location.store_time``): never a time
    another machine's clock wrote into the record. ``take`` proves an expiry on this
    machine's clock before it takes a lease over."""
    record, stat = _read(location)
    if stat is None or record.get("released"):
        return None
    try:
        age = location.store_time() - stat.modified_s
    except StorageError as exc:  # may not write the probe (read-only keys), or down
        log.warning("cannot read the store's clock beside %s (%s): taken as held", location, exc)
        return record or {"purpose": "unknown"}
    if age < _their_ttl(record) + STORE_TIME_GRAIN_S:
        return record or {"purpose": "unknown"}
    return None


def subject(location: Location) -> str:
    """What the lease at ``location`` holds, for messages: ``application clicks``
    (``<app>/_lease``) or ``table dims`` (``_dims.lease`` beside the table)."""
    if location.name == LEASE:
        return f"application {location.parent.name}"
    return f"table {location.name.removeprefix('_').removesuffix('.lease')}"


def _their_ttl(record: dict[str, Any], default_s: float = DEFAULT_TTL_S) -> float:
    """A record's time to live (``default_s`` when it does not say), within the
    bounds any holder takes: a record is another machine's text."""
    return min(max(_number(record, "ttl_s") or default_s, MIN_TTL_S), MAX_TTL_S)


def _unrenewed_for(record: dict[str, Any], default_s: float = DEFAULT_TTL_S) -> float | None:
    """None while the record is live by its writer's clock (renewed within its time
    to live); else how long a taker watches it before taking it over: 0 for a
    released lease, its time to live for one that looks expired or does not say."""
    if record.get("released"):
        return 0.0
    renewed = _number(record, "renewed_s") or _number(record, "since")
    age = None if renewed is None else time.time() - renewed
    ttl = _their_ttl(record, default_s)
    if age is not None and 0 <= age < ttl:
        return None
    return ttl


def take(location: Location, purpose: str, user: str, ttl_s: float = DEFAULT_TTL_S) -> Lease:
    """Take the lease at ``location`` or raise LeaseError naming its holder."""
    ttl_s = checked_ttl(ttl_s)
    record = holder_record(purpose, user)
    started = _clock()
    try:
        created = location.create(_encode({**record, "generation": 1}, ttl_s))
        return _held(location, record, ttl_s, created, 1, started)
    except AlreadyExistsError:
        pass
    found, stat = _read(location)
    if stat is None or stat.etag is None:  # released and deleted by hand meanwhile
        raise LeaseError(f"the lease {location} changed while taking it: try again")
    if found.get("holder") == record["holder"]:
        # Our own create went through although its answer was lost (a retried PUT).
        return _held(location, record, ttl_s, stat, int(found["generation"]), started)
    previous = _number(found, "generation")
    generation = max(int(previous), 0) + 1 if previous is not None else 1
    watch_s = _unrenewed_for(found, ttl_s)
    if watch_s is None:
        renewed = _number(found, "renewed_s") or _number(found, "since") or 0.0
        raise LeaseError(
            f"{subject(location)} is busy: held by {describe(found)}, "
            f"renewed {time.time() - renewed:.0f} s ago; if that process is gone, its lease "
            f"expires {_their_ttl(found, ttl_s):.0f} s after its last renewal: try again then"
        )
    if watch_s:
        # Stale by its writer's clock (or a clock ahead of ours, or a record that
        # does not say): prove it on ours, by watching for a renewal.
        log.warning(
            "the lease on %s was not renewed by %s: taking it over if it stays so for %.0f s",
            subject(location),
            describe(found),
            watch_s,
        )
        _watch(location, stat, watch_s)
    started = _clock()
    try:
        taken = location.update(_encode({**record, "generation": generation}, ttl_s), stat.etag)
    except ChangedError:
        found, now = _read(location)
        if now is None or now.etag is None or found.get("holder") != record["holder"]:
            raise LeaseError(
                f"{subject(location)} is busy: another holder took its lease first"
            ) from None
        # Our takeover went through although its answer was lost (a retried PUT).
        taken = now
    return _held(location, record, ttl_s, taken, generation, started)


def _watch(location: Location, seen: Stat, ttl_s: float) -> None:
    """Return once ``seen`` stayed the lease's version for ``ttl_s`` on this
    machine's clock; LeaseError when its holder renews it meanwhile."""
    deadline = _clock() + ttl_s
    while _clock() < deadline:
        now = location.stat()
        if now is None or now.etag != seen.etag:
            raise LeaseError(
                f"{subject(location)} is busy: its lease was renewed "
                "while this taker waited for it to expire"
            )
        time.sleep(min(1.0, ttl_s / 10))


def _held(
    location: Location, record: dict[str, Any], ttl_s: float, stat: Stat, gen: int, since: float
) -> Lease:
    if stat.etag is None:
        raise LeaseError(f"the store of {location} gives no version tags: it cannot hold a lease")
    lease = Lease(location, record, ttl_s, stat.etag, gen, since)
    lease.start_renewing()
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
