"""A conditional write the store applied whose answer was lost on the network: every
such write the platform makes to S3 goes through a proxy (``tests/s3_proxy.py``,
in a process of its own: delta-rs holds the GIL while it waits) that applies it and
closes the connection unanswered. The platform must know its own write when the
retry (the client's, or its own) finds it there: no false "busy", ``FencedError``
or duplicate. What the store holds afterwards is read around the proxy, straight
from the S3 server, not from what the code under test returns."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from deltalake import DeltaTable
from obstore.store import S3Store

from jobs import audit as audit_module
from jobs import lease
from jobs.audit import AUDIT_ID, append_audit, audit_row
from jobs.cut import Cut, StateAction, claim_first_cut, cut_file, write_cut
from jobs.delta import layout as tables
from jobs.delta import writer as writer_module
from jobs.delta.layout import AppLayout
from jobs.delta.writer import bump_epoch, fence_txn_id
from jobs.operations import saved_plans
from jobs.operations.plan import Plan
from jobs.pipeline.model import Pipeline
from jobs.settings import REPO_ROOT
from jobs.storage_server import StorageInfo
from jobs.warehouse import Location
from tests.output_tables import StateWriter, clicks_pipeline
from tests.s3_proxy import drop

pytestmark = pytest.mark.integration


class Proxy:
    """The proxy process's drops and writes, from the moment one was armed."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.seen = (0, 0)

    def lose_next_reply(self, pattern: str) -> None:
        """The next write to a path ``pattern`` matches is applied, unanswered."""
        found = drop(self.endpoint, pattern)
        self.seen = (len(found["dropped"]), len(found["writes"]))

    def lost(self) -> list[tuple[str, str, int]]:
        """The writes whose answer was lost since ``lose_next_reply``."""
        found = drop(self.endpoint)["dropped"][self.seen[0] :]
        return [(m, urllib.parse.unquote(p), s) for _t, m, p, s in found]

    def writes(self, pattern: str) -> list[tuple[str, int]]:
        """Each write to a path ``pattern`` matches since then, with the store's status:
        the client's own retries show here."""
        found = drop(self.endpoint)["writes"][self.seen[1] :]
        return [(m, s) for _t, m, p, s in found if re.search(pattern, urllib.parse.unquote(p))]


@pytest.fixture(scope="module")
def proxy_process(s3_server: StorageInfo) -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.s3_proxy", str(s3_server.port)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline().strip()
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def proxy(proxy_process: str, s3_warehouse: Location) -> Iterator[Proxy]:
    """The proxy, disarmed; ``through`` sends this test's requests through it."""
    drop(proxy_process, "")
    yield Proxy(proxy_process)
    drop(proxy_process, "")


@pytest.fixture
def through(proxy: Proxy, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Call to send the platform's requests (obstore's and delta-rs') through the
    proxy from then on (set-up before it reaches the store directly)."""
    return lambda: monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)


def direct(s3_server: StorageInfo, where: Location) -> tuple[S3Store, str]:
    """A client of the S3 server itself (not the proxy), and ``where``'s key."""
    store = S3Store(
        where.bucket,
        config={
            "endpoint": s3_server.endpoint,
            "access_key_id": s3_server.access_key,
            "secret_access_key": s3_server.secret_key,
            "region": "us-east-1",
        },
        client_options={"allow_http": True},
    )
    return store, where.key


def stored(s3_server: StorageInfo, where: Location) -> bytes:
    import obstore

    store, key = direct(s3_server, where)
    return bytes(obstore.get(store, key).bytes())


def stored_etag(s3_server: StorageInfo, where: Location) -> str | None:
    import obstore

    store, key = direct(s3_server, where)
    return obstore.head(store, key)["e_tag"]


def log_entries(s3_server: StorageInfo, table: Location) -> dict[int, list[dict[str, Any]]]:
    """A Delta table's log, entry by entry, read from the store's objects."""
    import obstore

    store, key = direct(s3_server, table / "_delta_log")
    found = {}
    for chunk in obstore.list(store, key + "/"):
        for meta in chunk:
            name = meta["path"].rsplit("/", 1)[-1]
            if re.fullmatch(r"\d{20}\.json", name):
                text = bytes(obstore.get(store, meta["path"]).bytes()).decode()
                found[int(name[:20])] = [json.loads(line) for line in text.splitlines() if line]
    return dict(sorted(found.items()))


def delta_direct(s3_server: StorageInfo, table: Location) -> DeltaTable:
    return DeltaTable(
        str(table),
        storage_options={
            "AWS_ENDPOINT_URL": s3_server.endpoint,
            "AWS_ACCESS_KEY_ID": s3_server.access_key,
            "AWS_SECRET_ACCESS_KEY": s3_server.secret_key,
            "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
        },
    )


def applied(proxy: Proxy, pattern: str) -> None:
    """Exactly one write, to a path ``pattern`` matches, was applied unanswered, and
    the client (obstore's or delta-rs' retries) sent it again at once, which the
    store refused (412): what the platform then met."""
    lost = proxy.lost()
    assert len(lost) == 1, lost
    assert re.search(pattern, lost[0][1]) and lost[0][2] == 200, lost
    writes = proxy.writes(pattern)
    first = writes.index(("PUT", 200))
    assert writes[first : first + 2] == [("PUT", 200), ("PUT", 412)], writes


# -- the lease ---------------------------------------------------------------


LEASE = r"/_lease$"
TTL_S = 120.0  # no renewal of its own within a test


def assert_held_as_stored(
    s3_server: StorageInfo, where: Location, held: lease.Lease, generation: int
) -> None:
    """The store holds this holder's record at ``generation``, at the version it has."""
    assert held.generation == generation
    record = json.loads(stored(s3_server, where))
    assert record["holder"] == held.holder["holder"] and record["generation"] == generation
    assert held.etag == stored_etag(s3_server, where)


def test_a_lease_taken_whose_answer_was_lost_is_held_at_generation_1(
    s3_server: StorageInfo, s3_warehouse: Location, proxy: Proxy, through: Any
) -> None:
    where = s3_warehouse / "app" / lease.LEASE
    through()
    proxy.lose_next_reply(LEASE)
    held = lease.take(where, "run", "me", TTL_S)
    try:
        applied(proxy, LEASE)
        assert_held_as_stored(s3_server, where, held, 1)
        held.check()
    finally:
        held.release()


def test_a_lease_taken_over_whose_answer_was_lost_is_the_takers(
    s3_server: StorageInfo, s3_warehouse: Location, proxy: Proxy, through: Any
) -> None:
    """The expired holder's record is replaced (``If-Match``) after its one-second
    watch; the create before it is refused (412) and answered."""
    where = s3_warehouse / "app" / lease.LEASE
    gone = {**lease.holder_record("run", "other machine"), "generation": 4}
    where.create(json.dumps({**gone, "renewed_s": time.time() - 600, "ttl_s": 1}).encode())
    through()
    proxy.lose_next_reply(LEASE)
    held = lease.take(where, "rewind", "me", TTL_S)
    try:
        applied(proxy, LEASE)
        assert_held_as_stored(s3_server, where, held, 5)
    finally:
        held.release()


def test_a_renewal_advance_and_release_whose_answers_were_lost_stay_the_holders(
    s3_server: StorageInfo,
    s3_warehouse: Location,
    proxy: Proxy,
    through: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    where = s3_warehouse / "app" / lease.LEASE
    through()
    held = lease.take(where, "run", "me", TTL_S)
    try:
        proxy.lose_next_reply(LEASE)
        held.renew()
        applied(proxy, LEASE)
        held.check()  # not lost
        assert held.etag == stored_etag(s3_server, where)
        assert json.loads(stored(s3_server, where))["holder"] == held.holder["holder"]

        proxy.lose_next_reply(LEASE)
        assert held.advance_past(7) == 8
        applied(proxy, LEASE)
        held.check()
        assert held.etag == stored_etag(s3_server, where)
        record = json.loads(stored(s3_server, where))
        assert record["holder"] == held.holder["holder"] and record["generation"] == 8

        proxy.lose_next_reply(LEASE)
    finally:
        with caplog.at_level(logging.WARNING, logger="jobs.lease"):
            held.release()
    applied(proxy, LEASE)
    record = json.loads(stored(s3_server, where))
    assert record["holder"] == held.holder["holder"] and record["released"] is True
    # Its own release, not "could not release the lease ... is no longer version".
    assert not [r.getMessage() for r in caplog.records if "could not release" in r.getMessage()]
    assert lease.current(where) is None  # free for the next taker at once


# -- cuts ----------------------------------------------------------------------


def test_a_cut_and_its_replacement_whose_answers_were_lost_are_the_attempts_own(
    s3_server: StorageInfo, s3_warehouse: Location, proxy: Proxy, through: Any
) -> None:
    layout = AppLayout(s3_warehouse, "user_clicks")
    through()
    first = Cut(0, {"clicks": {"0": 5}}, "pipeline")
    proxy.lose_next_reply(r"/epoch=0\.json$")
    assert claim_first_cut(layout, first) == first
    applied(proxy, r"/epoch=0\.json$")
    assert stored(s3_server, cut_file(layout, 0)) == first.to_json().encode()

    cut = Cut(1, {"clicks": {"0": 10}}, "rewind")
    proxy.lose_next_reply(r"/epoch=1\.json$")
    write_cut(layout, cut)  # created If-None-Match
    applied(proxy, r"/epoch=1\.json$")
    assert stored(s3_server, cut_file(layout, 1)) == cut.to_json().encode()

    # Another attempt's cut of an epoch not begun (no ledger: epoch -1) is replaced
    # If-Match: the create before it is refused (412) and answered.
    other = Cut(1, {"clicks": {"0": 20}}, "rewind")
    proxy.lose_next_reply(r"/epoch=1\.json$")
    write_cut(layout, other)
    applied(proxy, r"/epoch=1\.json$")
    assert stored(s3_server, cut_file(layout, 1)) == other.to_json().encode()


# -- Delta commits: the epoch bump, audit rows -----------------------------------


LEDGER_COMMIT = r"/_ledger/_delta_log/\d{20}\.json$"


@pytest.fixture
def app(s3_warehouse: Location) -> tuple[AppLayout, Pipeline]:
    """An application's tables, made straight on the store."""
    writer = StateWriter(s3_warehouse, clicks_pipeline())  # type: ignore[arg-type]
    return writer.layout, writer.pipeline


def spy_own_commit(module: Any, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """What each look for an earlier commit of one's own (``own_commit``) found."""
    found: list[bool] = []
    real = module.own_commit

    def own_commit(*args: Any) -> bool:
        found.append(real(*args))
        return found[-1]

    monkeypatch.setattr(module, "own_commit", own_commit)
    return found


def test_an_epoch_bump_whose_commit_answer_was_lost_is_its_own(
    s3_server: StorageInfo,
    app: tuple[AppLayout, Pipeline],
    proxy: Proxy,
    through: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """delta-rs resends the log entry's PUT, which the store refuses (412): the
    commit fails as a conflict with the first (``CommitFailedError``), and the bump
    finds its own commit by its id."""
    layout, _pipeline = app
    paths = [layout.table(tables.LEDGER), layout.table("state")]
    fence = fence_txn_id(layout.application_id)
    looked = spy_own_commit(writer_module, monkeypatch)
    through()
    proxy.lose_next_reply(LEDGER_COMMIT)
    bump_epoch(paths, layout.application_id, 1, "a lost answer")  # no FencedError
    applied(proxy, LEDGER_COMMIT)
    assert looked == [True]
    for path in paths:
        assert delta_direct(s3_server, path).transaction_version(fence) == 1
    bumps = [
        version
        for version, actions in log_entries(s3_server, paths[0]).items()
        for action in actions
        if action.get("txn", {}).get("appId") == fence
    ]
    assert len(bumps) == 1, bumps  # the fence set once, by one commit


def test_an_audit_row_whose_commit_answer_was_lost_is_in_the_ledger_once(
    s3_server: StorageInfo,
    app: tuple[AppLayout, Pipeline],
    proxy: Proxy,
    through: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    layout, pipeline = app
    ledger = layout.table(tables.LEDGER)
    marker = uuid.uuid4().hex
    looked = spy_own_commit(audit_module, monkeypatch)
    through()
    proxy.lose_next_reply(LEDGER_COMMIT)
    append_audit(layout, audit_row(pipeline, "rewind", 0, {"marker": marker}))
    applied(proxy, LEDGER_COMMIT)
    assert looked == [True]  # the retried commit conflicted with its first
    rows = delta_direct(s3_server, ledger).to_pyarrow_table().to_pylist()
    assert [json.loads(r["details"]).get("marker") for r in rows].count(marker) == 1
    audits = [
        action["commitInfo"]
        for actions in log_entries(s3_server, ledger).values()
        for action in actions
        if AUDIT_ID in action.get("commitInfo", {})
    ]
    assert len(audits) == 1, audits


# -- saved plans -----------------------------------------------------------------


def test_a_saved_plan_whose_answer_was_lost_is_found_by_its_retry(
    s3_server: StorageInfo,
    app: tuple[AppLayout, Pipeline],
    proxy: Proxy,
    through: Any,
) -> None:
    layout, pipeline = app
    plan = Plan(
        operation="rewind",
        application_id=pipeline.application_id,
        reason="replay",
        epoch_before=0,
        epoch_after=1,
        current_offsets={("clicks", 0): 900},
        target_offsets={("clicks", 0): 400},
        seed_state_version=None,
        state_action=StateAction.EMPTY,
    )
    through()
    proxy.lose_next_reply(r"/_plans/.*\.json$")
    plan_id = saved_plans.save(layout, pipeline, plan, {"preview": {"keys": 3}})
    applied(proxy, r"/_plans/.*\.json$")
    found = json.loads(stored(s3_server, saved_plans.plans_dir(layout) / f"{plan_id}.json"))
    assert found["id"] == plan_id and found["extra"] == {"preview": {"keys": 3}}
    assert Plan.from_dict(found["plan"]) == Plan(**{**plan.__dict__, "plan_id": plan_id})
