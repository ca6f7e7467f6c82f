"""The warehouse's files behave the same on a local disk and on the S3 server:
whole writes, create-only-if-absent, listings, copies stamped now, deletes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from jobs.warehouse import AlreadyExistsError, ChangedError, Location, StorageError


@pytest.fixture(params=["local", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> Location:
    if request.param == "local":
        return Location.local_path(tmp_path / "warehouse")
    return request.getfixturevalue("s3_warehouse")  # type: ignore[no-any-return]


def test_a_written_file_reads_back_whole_and_is_listed(root: Location) -> None:
    app = root / "app"
    assert not app.exists() and app.iterdir() == [] and app.stat() is None
    (app / "cuts" / "1.json").write_text('{"epoch": 1}')
    (app / "cuts" / "1.json").write_text('{"epoch": 1, "again": true}')  # replaced whole
    (app / "plan.json").write_bytes(b"x" * 1000)
    assert (app / "cuts" / "1.json").read_text() == '{"epoch": 1, "again": true}'
    assert [c.name for c in app.iterdir()] == ["cuts", "plan.json"]
    assert app.is_dir() and (app / "cuts").is_dir() and not (app / "plan.json").is_dir()
    found = (app / "plan.json").stat()
    assert found is not None and found.size == 1000
    assert abs(found.modified_s - time.time()) < 5
    # Nothing temporary is left beside the files.
    assert [c.name for c in (app / "cuts").iterdir()] == ["1.json"]
    with pytest.raises(FileNotFoundError):
        (app / "missing").read_bytes()


def test_create_refuses_an_existing_file_and_keeps_it(root: Location) -> None:
    target = root / "app" / "seed-3"
    target.create(b"first")
    with pytest.raises(AlreadyExistsError):
        target.create(b"second")
    assert target.read_bytes() == b"first"


def test_a_copy_is_stamped_with_the_time_it_was_made(root: Location) -> None:
    source = root / "t" / "_staging" / "part-e1-b0-x.parquet"
    source.write_bytes(b"data")
    time.sleep(1.2)  # S3 stores times to the second
    source.copy_to(root / "t" / "part-e1-b0-x.parquet")
    copied, original = (root / "t" / "part-e1-b0-x.parquet").stat(), source.stat()
    assert copied is not None and original is not None
    assert copied.modified_s >= original.modified_s + 1
    assert (root / "t" / "part-e1-b0-x.parquet").read_bytes() == b"data"


def test_deletes_remove_a_file_and_a_folder(root: Location) -> None:
    for i in range(1005):  # more than one listing page
        if i % 200 == 0 or i > 1000:
            (root / "gone" / "deep" / f"{i}").write_bytes(b"1")
    (root / "kept").write_bytes(b"1")
    (root / "kept").delete()
    (root / "kept").delete()  # nothing there: nothing happens
    (root / "gone").delete_tree()
    assert not (root / "gone").exists() and not (root / "kept").exists()


def test_update_replaces_only_the_version_read_on_s3(s3_warehouse: Location) -> None:
    lease = s3_warehouse / "app" / "_lease"
    first = lease.create(b"a")
    assert first.etag
    second = lease.update(b"b", first.etag)
    with pytest.raises(ChangedError):
        lease.update(b"c", first.etag)
    with pytest.raises(ChangedError):
        (s3_warehouse / "none").update(b"c", first.etag)
    assert second.etag and lease.read_bytes() == b"b"


def test_a_store_that_does_not_answer_is_one_line_naming_it(
    s3_warehouse: Location, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jobs.local_server import find_free_port

    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{find_free_port(29000, 29500)}")
    with pytest.raises(StorageError, match=r"could not read s3://.*AWS_ENDPOINT_URL"):
        (s3_warehouse / "x").read_bytes()


def test_folder_markers_that_spark_writes_are_not_files(s3_warehouse: Location) -> None:
    import obstore
    from obstore.store import S3Store

    store = S3Store(s3_warehouse.bucket, client_options={"allow_http": True})
    obstore.put(store, f"{s3_warehouse.key}/cp/offsets/", b"")  # what S3A leaves
    (s3_warehouse / "cp" / "offsets" / "0").write_bytes(b"v1")
    assert [c.name for c in (s3_warehouse / "cp" / "offsets").iterdir()] == ["0"]
    assert [c.name for c, _ in (s3_warehouse / "cp" / "offsets").files()] == ["0"]
    assert [c.name for c in (s3_warehouse / "cp").all_files()] == ["0"]


def test_the_stores_clock_is_what_its_objects_times_compare_with(root: Location) -> None:
    written = root / "app" / "_lease"
    written.write_bytes(b"{}")
    found = written.stat()
    assert found is not None
    now = written.store_time()
    assert found.modified_s - 1 <= now <= found.modified_s + 5  # one clock, to the second
    assert abs(now - time.time()) < 5  # the store runs on this machine here
    assert [c.name for c in (root / "app").iterdir()] == ["_lease"]  # nothing written
    assert (root / "app" / "missing").store_time() >= now  # a 404 still carries the Date
