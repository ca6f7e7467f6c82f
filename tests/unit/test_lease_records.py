"""The lease's taking rules against records another machine wrote, on an
in-memory store with version tags (the store itself is tested on the real S3
server: tests/integration/test_lease.py)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from jobs import lease
from jobs.warehouse import AlreadyExistsError, ChangedError, Stat


@dataclass
class FakeStore:
    objects: dict[str, tuple[bytes, str]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    clock: Callable[[], float] = time.time  # the store's own clock
    times: dict[str, float] = field(default_factory=dict)  # each object's, by that clock


@dataclass
class FakeLocation:
    """The calls the lease makes, with S3's conditional semantics."""

    store: FakeStore
    key: str = "app/_lease"
    lose_create_answer: bool = False

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    @property
    def parent(self) -> Any:
        return type("Folder", (), {"name": self.key.rsplit("/", 2)[-2]})()

    def stat(self) -> Stat | None:
        with self.store.lock:
            found = self.store.objects.get(self.key)
        if found is None:
            return None
        return Stat(len(found[0]), self.store.times[self.key], found[1])

    def store_time(self) -> float:
        return self.store.clock()

    def _written(self) -> None:
        self.store.times[self.key] = self.store.clock()

    def read_bytes(self) -> bytes:
        with self.store.lock:
            found = self.store.objects.get(self.key)
        if found is None:
            raise FileNotFoundError(self.key)
        return found[0]

    def create(self, data: bytes) -> Stat:
        with self.store.lock:
            if self.key in self.store.objects:
                raise AlreadyExistsError(self.key)
            self.store.objects[self.key] = (data, uuid.uuid4().hex)
            self._written()
        if self.lose_create_answer:  # written, but the answer never came back
            raise AlreadyExistsError(self.key)
        return Stat(len(data), self.store.times[self.key], self.store.objects[self.key][1])

    def update(self, data: bytes, etag: str) -> Stat:
        with self.store.lock:
            found = self.store.objects.get(self.key)
            if found is None or found[1] != etag:
                raise ChangedError(self.key)
            self.store.objects[self.key] = (data, uuid.uuid4().hex)
            self._written()
            return Stat(len(data), self.store.times[self.key], self.store.objects[self.key][1])

    def put_raw(self, data: bytes) -> None:
        with self.store.lock:
            self.store.objects[self.key] = (data, uuid.uuid4().hex)
            self._written()


def _record(**fields: Any) -> bytes:
    return json.dumps({"purpose": "run", "holder": "other", **fields}).encode()


@pytest.fixture
def where() -> FakeLocation:
    return FakeLocation(FakeStore())


def _take(where: FakeLocation, ttl_s: float = lease.MIN_TTL_S) -> lease.Lease:
    return lease.take(where, "op", "me", ttl_s)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("key", "named"),
    [("apps/clicks/_lease", "application clicks"), ("dims/_merchants.lease", "table merchants")],
)
def test_a_busy_lease_names_what_it_holds(key: str, named: str) -> None:
    where = FakeLocation(FakeStore(), key)
    where.put_raw(_record(renewed_s=time.time(), ttl_s=30))
    with pytest.raises(lease.LeaseError, match=rf"^{named} is busy: held by"):
        _take(where)


@pytest.mark.parametrize("ttl", [0, -1, float("nan"), float("inf"), 1e9, 0.5])
def test_a_lease_time_out_of_bounds_is_refused(where: FakeLocation, ttl: float) -> None:
    with pytest.raises(ValueError, match="a lease lasts"):
        _take(where, ttl)


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"[1, 2]",
        _record(generation="x", renewed_s="soon", ttl_s="long"),
        _record(generation=4, renewed_s=float("nan"), ttl_s=float("nan")),
        _record(generation=4, renewed_s=time.time(), ttl_s=-1),  # would be taken at once
        _record(generation=4, renewed_s=time.time() + 3600, ttl_s=1),  # a clock ahead
    ],
    ids=["not-json", "a-list", "wrong-types", "nan", "negative-ttl", "clock-ahead"],
)
def test_a_record_that_does_not_say_when_it_expires_is_watched_then_taken(
    where: FakeLocation, raw: bytes
) -> None:
    where.put_raw(raw)
    started = time.monotonic()
    held = _take(where)
    try:
        assert time.monotonic() - started >= lease.MIN_TTL_S  # watched, not taken at once
        assert held.generation >= 1
        if b'"generation": 4' in raw:
            assert held.generation == 5  # never backwards
    finally:
        held.release()


def test_a_huge_lease_time_in_a_record_is_bounded(where: FakeLocation) -> None:
    where.put_raw(_record(generation=1, renewed_s=time.time() - 2 * lease.MAX_TTL_S, ttl_s=1e12))
    watched: list[float] = []
    real_watch = lease._watch
    lease._watch = lambda loc, seen, ttl: watched.append(ttl)  # type: ignore[assignment]
    try:
        _take(where).release()
    finally:
        lease._watch = real_watch
    assert watched == [lease.MAX_TTL_S]


def test_a_stale_looking_lease_renewed_during_the_watch_stays_busy(where: FakeLocation) -> None:
    where.put_raw(_record(generation=2, renewed_s=time.time() - 60, ttl_s=2))
    stop = threading.Event()

    def renew() -> None:  # a live holder whose clock is behind ours
        while not stop.wait(0.3):
            where.put_raw(_record(generation=2, renewed_s=time.time() - 60, ttl_s=2))

    renewer = threading.Thread(target=renew)
    renewer.start()
    try:
        with pytest.raises(lease.LeaseError, match="renewed while this taker waited"):
            _take(where, 2)
    finally:
        stop.set()
        renewer.join()


def test_a_create_whose_answer_was_lost_is_ours(where: FakeLocation) -> None:
    where.lose_create_answer = True
    held = _take(where)
    assert held.generation == 1
    held.check()
    held.release()
    assert json.loads(where.read_bytes())["released"] is True


def test_a_release_waits_for_a_renewal_under_way(where: FakeLocation) -> None:
    held = _take(where)
    real_update = where.update

    def slow_update(data: bytes, etag: str) -> Stat:
        time.sleep(0.2)
        return real_update(data, etag)

    where.update = slow_update  # type: ignore[method-assign]
    time.sleep(lease.MIN_TTL_S / lease.RENEWALS_PER_TTL + 0.05)  # a renewal has started
    held.release()
    assert json.loads(where.read_bytes())["released"] is True


def test_a_lease_its_holder_stopped_renewing_holds_nothing_for_a_pre_check(
    where: FakeLocation,
) -> None:
    """``current`` is what commands check before they start (and what status
    shows): a holder that was killed must not block them for ever. A record the
    store stored within its time to live (bounded) holds, whatever the times in it
    say; one older by the store's clock, or released, does not (``take`` then proves
    it on this machine's clock before taking it)."""
    now = [1_000_000.0]
    where.store.clock = lambda: now[0]
    for raw in (
        _record(generation=3, renewed_s=0, ttl_s=2),
        _record(generation=3, renewed_s="soon", ttl_s=2),
        b"not json",  # a record that cannot be read: its holder is unknown, not absent
    ):
        where.put_raw(raw)
        now[0] += 1.0
        assert lease.current(where) is not None, raw  # type: ignore[arg-type]
        now[0] += lease.DEFAULT_TTL_S + 2
        assert lease.current(where) is None, raw  # type: ignore[arg-type]
    where.put_raw(_record(generation=3, ttl_s=1e12))  # bounded
    now[0] += lease.MAX_TTL_S - 10
    assert lease.current(where) is not None  # type: ignore[arg-type]
    now[0] += 20
    assert lease.current(where) is None  # type: ignore[arg-type]


def test_a_renewal_whose_answer_was_lost_is_still_ours_and_released(where: FakeLocation) -> None:
    """The store was frozen: a renewal's PUT timed out on this side but was applied
    when the store resumed (measured with SeaweedFS under SIGSTOP). The version is
    new and unknown here, yet the record is this holder's own: the next renewal and
    the release go on from it (before, the release failed and the next run waited a
    whole lease time to take over a lease no one held)."""
    held = _take(where)
    real_update = where.update
    lose_answer = [True]

    def update(data: bytes, etag: str) -> Stat:
        written = real_update(data, etag)
        if lose_answer and lose_answer.pop():
            raise lease.StorageError("could not write app/_lease: timed out")
        return written

    where.update = update  # type: ignore[method-assign]
    with pytest.raises(lease.StorageError):
        held.renew()
    held.renew()  # from the version its lost write made
    held.check()
    lose_answer.append(True)
    with contextlib.suppress(lease.StorageError):
        held.renew()
    held.release()
    assert json.loads(where.read_bytes())["released"] is True
    assert lease.current(where) is None  # type: ignore[arg-type]


def test_a_lease_another_holder_took_is_not_adopted(where: FakeLocation) -> None:
    held = _take(where)
    where.put_raw(_record(generation=2, renewed_s=time.time(), ttl_s=30))  # the other's
    held.renew()
    with pytest.raises(lease.LeaseLostError, match="taken over"):
        held.check()
    held.release()
    assert json.loads(where.read_bytes())["holder"] == "other"


def test_a_takeover_whose_answer_was_lost_is_ours(where: FakeLocation) -> None:
    """The takeover's PUT was applied, its answer lost, and the client's retry found
    another version (its own): the taker holds the lease; it is not 'busy' (which
    left the lease orphaned for two lease times)."""
    where.put_raw(_record(generation=4, renewed_s=time.time() - 60, ttl_s=1))
    real_update = where.update

    def applied_then_refused(data: bytes, etag: str) -> Stat:
        real_update(data, etag)
        raise ChangedError(where.key)  # the retry of the PUT: 412, the version is new

    where.update = applied_then_refused  # type: ignore[method-assign]
    held = _take(where)
    where.update = real_update  # type: ignore[method-assign]
    try:
        assert held.generation == 5
        assert json.loads(where.read_bytes())["holder"] == held.holder["holder"]
        held.check()
        held.renew()  # from the version its lost write made
    finally:
        held.release()
    assert json.loads(where.read_bytes())["released"] is True


def test_whether_a_lease_is_held_rests_on_the_stores_clock_alone(where: FakeLocation) -> None:
    """A pre-check (``current``) judges a record's age by the store's clock (the
    object's time against the store's now), never by the time its writer's clock put
    in it: a holder whose clock runs ahead or behind is held while it renews."""
    store_now = [1_000_000.0]
    where.store.clock = lambda: store_now[0]
    for skew in (-3600.0, -2.0, 0.0, 2.0, 3600.0):  # the writer's clock against ours
        where.put_raw(_record(generation=3, renewed_s=time.time() + skew, ttl_s=2))
        store_now[0] += 1.5  # within its time to live, on the store's clock
        assert lease.current(where) is not None, skew  # type: ignore[arg-type]
    store_now[0] += 5  # no renewal for longer than its time to live
    assert lease.current(where) is None  # type: ignore[arg-type]
    where.put_raw(_record(generation=3, renewed_s=time.time(), ttl_s=2, released=True))
    assert lease.current(where) is None  # type: ignore[arg-type]


def test_a_holder_advances_its_generation_past_one_a_table_recorded(where: FakeLocation) -> None:
    """A lease object deleted by hand starts again at generation 1, below the token
    a table recorded from an earlier lease: the holder writes itself past it (its own
    version, ``If-Match``), and the next taker goes on from there, never below."""
    held = _take(where)
    try:
        assert held.generation == 1
        assert held.advance_past(5) == 6 and held.generation == 6
        record = json.loads(where.read_bytes())
        assert record["generation"] == 6 and record["holder"] == held.holder["holder"]
        held.check()
        held.renew()  # from the advanced version, with the advanced generation
        assert json.loads(where.read_bytes())["generation"] == 6
        held.check()
        before = where.stat()
        assert held.advance_past(3) == 6  # already past: nothing written
        assert where.stat() == before
    finally:
        held.release()
    again = _take(where)
    try:
        assert again.generation == 7
    finally:
        again.release()


def test_a_holder_taken_over_cannot_advance_its_generation(where: FakeLocation) -> None:
    """A stale holder (another took the lease over and loaded with its generation)
    is refused: the advance is conditional on the version it holds."""
    held = _take(where)
    where.put_raw(_record(generation=6, renewed_s=time.time(), ttl_s=30))  # the other's
    taken = where.read_bytes()
    with pytest.raises(lease.LeaseLostError, match=r"^the lease on application app was taken over"):
        held.advance_past(6)
    assert where.read_bytes() == taken
    with pytest.raises(lease.LeaseLostError, match="taken over"):
        held.check()
    held.release()
    assert where.read_bytes() == taken


def test_an_advance_whose_answer_was_lost_is_ours(where: FakeLocation) -> None:
    held = _take(where)
    real_update = where.update

    def applied_then_refused(data: bytes, etag: str) -> Stat:
        real_update(data, etag)
        raise ChangedError(where.key)  # the retry of the PUT: 412, the version is new

    where.update = applied_then_refused  # type: ignore[method-assign]
    try:
        assert held.advance_past(4) == 5
    finally:
        where.update = real_update  # type: ignore[method-assign]
    held.check()
    held.renew()  # from the version its lost write made
    held.check()
    held.release()
    assert json.loads(where.read_bytes())["released"] is True
    assert json.loads(where.read_bytes())["generation"] == 5
