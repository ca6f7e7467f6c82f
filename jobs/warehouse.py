"""The warehouse: where applications keep their tables, cuts, plans, Spark
checkpoints and leases. It is a local folder (the embedded default) or
``s3://bucket/prefix`` on any S3-compatible store with conditional writes.

Every read, write, listing and delete of a warehouse file goes through a
``Location`` from here, so the rest of the platform says what it wants (a whole
file, a file that must not exist yet, a replacement of the version it read) and
never how a store gets it:

* ``write_bytes``: whole or absent. A local file is written under a temporary
  name and renamed; an S3 object is one PUT (S3 has no rename and needs none).
* ``create``: only if nothing is there (``If-None-Match: *``; locally a hard
  link, which fails on an existing name). Per-epoch files that must never be
  overwritten use it.
* ``update``: only if the object is still the version read (``If-Match: <etag>``),
  the lease's renewal. S3 only: local applications are held with ``flock``.
* ``copy_to``: a server-side copy, stamped with the copy's time (what Delta's
  add actions and vacuum judge a data file's age by), then the source deleted by
  the caller when it wants a move.

S3 is reached with obstore (the Rust ``object_store`` that delta-rs uses too),
configured by the standard AWS variables (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``,
``AWS_ALLOW_HTTP``) that delta-rs and Spark's S3A read as well. A throttled or
failing request is retried with backoff (obstore's retries: 10 attempts within
``RETRY_TIMEOUT``) before it becomes a ``StorageError``.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, timedelta
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Literal

from jobs.errors import ConfigError, PlatformError

if TYPE_CHECKING:
    import pyarrow.dataset as ds
    from obstore.store import S3Store
    from pyarrow.fs import PyFileSystem

Scheme = Literal["file", "s3"]
# An S3 bucket's name (the rules AWS gives: 3-63 of lowercase letters, digits, dots
# and hyphens, starting and ending with a letter or digit).
BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
# A key's folder names (matched whole): no empty, '.' or '..' part (a prefix never
# escapes its bucket), no control characters, and none of '%', '#', '?' and '\',
# which the stores' URL parsers read as escapes or delimiters ('%2E%2E' is '..').
KEY_PART = re.compile(r"(?!\.{1,2}\Z)[^\x00-\x1f\x7f/%#?\\]+")

# A local folder's or file's name: any but '.', '..', '/' and NUL (a local
# warehouse's names are data: spaces, '#', '%', Unicode).
LOCAL_PART = re.compile(r"(?!\.{1,2}\Z)[^\x00/]+")
RETRY_TIMEOUT = timedelta(minutes=3)
# How long the signed URL that reads the store's clock is valid (``store_time``).
CLOCK_READ_EXPIRY = timedelta(minutes=5)


class StorageError(PlatformError):
    """The warehouse's store failed or refused a request."""


class AlreadyExistsError(StorageError):
    """A ``create`` found something there already."""


class ChangedError(StorageError):
    """An ``update`` found another version than the one it was given."""


@dataclass(frozen=True)
class Stat:
    size: int
    modified_s: float  # seconds since the epoch, the store's clock
    etag: str | None  # S3's version tag (None locally)


@dataclass(frozen=True, order=True)
class Location:
    """A file or folder in a warehouse: ``/abs/path`` or ``s3://bucket/key``."""

    uri: str

    @classmethod
    def parse(cls, text: str | Path, what: str = "the warehouse") -> Location:
        """A local path (made absolute) or ``s3://bucket[/prefix]``; anything else
        is refused with a line that says what is accepted."""
        raw = str(text).strip()
        if raw.startswith("s3a://"):
            raw = "s3://" + raw[len("s3a://") :]
        if raw.startswith("s3://"):
            bucket, _, key = raw[len("s3://") :].partition("/")
            parts = [p for p in key.split("/") if p]
            if not BUCKET.fullmatch(bucket) or not all(KEY_PART.fullmatch(p) for p in parts):
                raise ConfigError(
                    f"{what} {raw!r} is not a valid s3://bucket/prefix (a bucket is 3-63 "
                    "lowercase letters, digits, '.' and '-'; no '.' or '..' folder, no '%', '#', "
                    "'?' or '\\' in a name)"
                )
            return cls("/".join(["s3:/", bucket, *parts]))
        if re.match(r"^s3a?:(?!//)", raw):  # a URI that lost a slash (a Path made of it)
            raise ConfigError(f"{what} {raw!r} is neither a local path nor s3://bucket/prefix")
        scheme = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", raw)
        if scheme and scheme.group(1) != "file":
            raise ConfigError(
                f"{what} {raw!r} has scheme {scheme.group(1)}://, which the platform does not "
                "store to: use a local path or s3://bucket/prefix"
            )
        if not raw.removeprefix("file://"):
            raise ConfigError(f"{what} is empty: give a local path or s3://bucket/prefix")
        return cls(str(Path(raw.removeprefix("file://")).expanduser().resolve()))

    @classmethod
    def local_path(cls, path: Path) -> Location:
        return cls(str(path.resolve()))

    @property
    def scheme(self) -> Scheme:
        return "s3" if self.uri.startswith("s3://") else "file"

    @property
    def is_s3(self) -> bool:
        return self.scheme == "s3"

    @property
    def bucket(self) -> str:
        return self.uri[len("s3://") :].partition("/")[0]

    @property
    def key(self) -> str:
        """The object key (S3), without a leading or trailing '/'."""
        return self.uri[len("s3://") :].partition("/")[2]

    @property
    def path(self) -> Path:
        """The local path; an S3 location has none (the caller has a bug)."""
        if self.is_s3:
            raise ValueError(f"{self.uri} is not a local path")
        return Path(self.uri)

    @property
    def name(self) -> str:
        return self.uri.rstrip("/").rsplit("/", 1)[-1]

    @property
    def parent(self) -> Location:
        """The folder above; a bucket's and the root's is itself."""
        if self.is_s3 and not self.key:
            return self
        return Location(self.uri.rstrip("/").rsplit("/", 1)[0] or "/")

    def __truediv__(self, name: str) -> Location:
        part = KEY_PART if self.is_s3 else LOCAL_PART
        if not all(part.fullmatch(p) for p in name.split("/")):
            raise ValueError(f"invalid name {name!r} under {self.uri}")
        return Location(f"{self.uri.rstrip('/')}/{name}")

    def __str__(self) -> str:
        return self.uri

    def __fspath__(self) -> str:
        """A local location is a path to ``open`` and pyarrow; an S3 one never is."""
        if self.is_s3:
            raise TypeError(f"{self.uri} is not a local path: reach it through jobs/warehouse.py")
        return self.uri

    def as_uri(self) -> str:
        """A URI naming it (a local path escaped as ``file://``)."""
        return self.uri if self.is_s3 else self.path.as_uri()

    @property
    def spark_uri(self) -> str:
        """How Spark's Hadoop file systems name it (S3A for S3)."""
        return "s3a://" + self.uri[len("s3://") :] if self.is_s3 else self.uri

    # -- reads ---------------------------------------------------------------

    def read_bytes(self) -> bytes:
        """The file's bytes; FileNotFoundError when there is none."""
        return _backend(self).read(self)

    def read_text(self) -> str:
        return self.read_bytes().decode()

    def stat(self) -> Stat | None:
        """The file's size, time and version tag, or None when there is none."""
        return _backend(self).stat(self)

    def exists(self) -> bool:
        """A file is here (a folder with files in it counts locally, as on S3)."""
        return self.stat() is not None or self.is_dir()

    def is_dir(self) -> bool:
        """Something is stored under this folder (S3 has folders only as prefixes)."""
        return _backend(self).is_dir(self)

    def iterdir(self) -> list[Location]:
        """What is directly in this folder, files and folders, sorted; [] if none."""
        return sorted(_backend(self).children(self))

    def all_files(self) -> list[Location]:
        """Every file under this folder, however deep, sorted."""
        return sorted(_backend(self).all_files(self))

    def files(self) -> list[tuple[Location, Stat]]:
        """The files directly in this folder with their size and time, sorted, from
        one listing (no request per file on S3)."""
        return sorted(_backend(self).files(self), key=lambda found: found[0])

    # -- writes --------------------------------------------------------------

    def write_bytes(self, data: bytes) -> None:
        """Replace the file with ``data``, whole: a reader sees the old or the new."""
        _backend(self).write(self, data)

    def write_text(self, text: str) -> None:
        self.write_bytes(text.encode())

    def create(self, data: bytes) -> Stat:
        """Write ``data`` only if nothing is here; AlreadyExistsError otherwise."""
        return _backend(self).create(self, data)

    def update(self, data: bytes, etag: str) -> Stat:
        """Replace the file only if it is still version ``etag``; ChangedError
        otherwise (someone else wrote it, or it is gone)."""
        return _backend(self).update(self, data, etag)

    def store_time(self) -> float:
        """The store's clock now, in seconds since the epoch: what its objects' times
        (``Stat.modified_s``) compare with. On S3, the ``Date`` of the store's answer
        to a signed ``HEAD`` of this object (read-only: any answer, a 404 too, carries
        it); on a local disk, this machine's clock. A decision on an object's age
        takes both times from one clock."""
        return _backend(self).store_time(self)

    def open_reader(self) -> BinaryIO:
        """The file for reading, seekable (a Parquet footer is read from its end)."""
        return _backend(self).open_reader(self)

    def landing(self) -> Landing:
        """A local file to write this location's content into, which ``land``
        puts here whole (renamed beside it locally; uploaded from this machine's
        temporary folder to S3, in parts when large) and ``discard`` removes."""
        if self.is_s3:
            handle, name = tempfile.mkstemp(prefix="landing-", suffix=".tmp")
            os.close(handle)
            return Landing(self, Path(name))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return Landing(self, self.path.parent / f".{self.name}.{uuid.uuid4().hex[:12]}.tmp")

    def copy_to(self, target: Location) -> None:
        """Copy this file to ``target`` (replacing it), stamped now."""
        _backend(self).copy(self, target)

    def move_to(self, target: Location) -> None:
        """Move this file to ``target`` (replacing it), stamped now: a rename
        locally, a server-side copy and a delete on S3."""
        _backend(self).move(self, target)

    def delete(self) -> None:
        """Remove the file; nothing happens when there is none."""
        _backend(self).delete(self)

    def delete_tree(self) -> None:
        """Remove everything under this folder."""
        _backend(self).delete_tree(self)


@dataclass(frozen=True)
class Landing:
    """A file being written on this machine before it lands at ``target``."""

    target: Location
    path: Path

    def land(self) -> None:
        _backend(self.target).land(self.path, self.target)

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)


class _LocalFiles:
    """A warehouse on a local (or mounted) file system."""

    @staticmethod
    def read(loc: Location) -> bytes:
        return loc.path.read_bytes()

    @staticmethod
    def stat(loc: Location) -> Stat | None:
        try:
            found = loc.path.stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not os.path.isfile(loc.path):
            return None
        return Stat(found.st_size, found.st_mtime, None)

    @staticmethod
    def is_dir(loc: Location) -> bool:
        return loc.path.is_dir()

    @staticmethod
    def children(loc: Location) -> Iterator[Location]:
        if not loc.path.is_dir():
            return
        for child in loc.path.iterdir():
            yield Location(str(child))

    @staticmethod
    def all_files(loc: Location) -> Iterator[Location]:
        for found in loc.path.rglob("*"):
            if found.is_file():
                yield Location(str(found))

    def files(self, loc: Location) -> Iterator[tuple[Location, Stat]]:
        for child in self.children(loc):
            found = self.stat(child)
            if found is not None:
                yield child, found

    @staticmethod
    def _temporary(loc: Location, data: bytes) -> Path:
        path = loc.path
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f".{path.name}.{uuid.uuid4().hex[:12]}.tmp"
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        return tmp

    def write(self, loc: Location, data: bytes) -> None:
        os.replace(self._temporary(loc, data), loc.path)

    def create(self, loc: Location, data: bytes) -> Stat:
        tmp = self._temporary(loc, data)
        try:
            os.link(tmp, loc.path)  # atomic, and refused when the name exists
        except FileExistsError:
            raise AlreadyExistsError(f"{loc} exists already") from None
        finally:
            tmp.unlink(missing_ok=True)
        found = self.stat(loc)
        assert found is not None
        return found

    @staticmethod
    def update(loc: Location, data: bytes, etag: str) -> Stat:
        raise StorageError(
            f"{loc}: a conditional replacement needs an object store (a local warehouse is "
            "held with flock instead)"
        )

    @staticmethod
    def store_time(loc: Location) -> float:
        return _now_s()

    @staticmethod
    def open_reader(loc: Location) -> BinaryIO:
        return open(loc.path, "rb")

    @staticmethod
    def land(local: Path, target: Location) -> None:
        os.replace(local, target.path)  # beside it: the same file system

    @staticmethod
    def copy(source: Location, target: Location) -> None:
        target.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.path.parent / f".{target.name}.{uuid.uuid4().hex[:12]}.tmp"
        shutil.copyfile(source.path, tmp)
        os.replace(tmp, target.path)  # a new file: its time is now

    @staticmethod
    def move(source: Location, target: Location) -> None:
        target.path.parent.mkdir(parents=True, exist_ok=True)
        os.utime(source.path)  # stamped first: it never shows at target with an old time
        os.replace(source.path, target.path)

    @staticmethod
    def delete(loc: Location) -> None:
        loc.path.unlink(missing_ok=True)

    @staticmethod
    def delete_tree(loc: Location) -> None:
        shutil.rmtree(loc.path, ignore_errors=True)


class _S3Objects:
    """A warehouse on an S3-compatible store, through obstore."""

    @staticmethod
    def _store(loc: Location) -> S3Store:
        return _s3_store(loc.bucket, _s3_environment())

    def read(self, loc: Location) -> bytes:
        import obstore
        from obstore.exceptions import NotFoundError

        try:
            with _failures(loc, "read"):
                return bytes(obstore.get(self._store(loc), loc.key).bytes())
        except (FileNotFoundError, NotFoundError):
            raise FileNotFoundError(loc.uri) from None

    def stat(self, loc: Location) -> Stat | None:
        import obstore
        from obstore.exceptions import NotFoundError

        if not loc.key:
            return None
        try:
            with _failures(loc, "read"):
                meta = obstore.head(self._store(loc), loc.key)
        except (FileNotFoundError, NotFoundError):
            return None
        return Stat(meta["size"], meta["last_modified"].timestamp(), meta["e_tag"])

    def is_dir(self, loc: Location) -> bool:
        import obstore

        prefix = f"{loc.key}/" if loc.key else None
        with _failures(loc, "list"):
            for chunk in obstore.list(self._store(loc), prefix, chunk_size=1):
                if chunk:
                    return True
        return False

    def children(self, loc: Location) -> Iterator[Location]:
        import obstore

        prefix = f"{loc.key}/" if loc.key else None
        with _failures(loc, "list"):
            found = obstore.list_with_delimiter(self._store(loc), prefix)
        root = f"s3://{loc.bucket}"
        for folder in found["common_prefixes"]:
            yield Location(f"{root}/{folder.rstrip('/')}")
        for meta in found["objects"]:
            if meta["path"] != loc.key:  # the folder's own marker
                yield Location(f"{root}/{meta['path']}")

    def all_files(self, loc: Location) -> Iterator[Location]:
        import obstore

        prefix = f"{loc.key}/" if loc.key else None
        with _failures(loc, "list"):
            keys = [
                meta["path"]
                for chunk in obstore.list(self._store(loc), prefix, chunk_size=1000)
                for meta in chunk
            ]
        # A folder's marker (what S3A writes for ``dir/``) lists as the folder's
        # own key: not a file.
        folders = {key[:i] for key in keys for i, c in enumerate(key) if c == "/"}
        for key in keys:
            if key not in folders and key != loc.key:
                yield Location(f"s3://{loc.bucket}/{key}")

    def files(self, loc: Location) -> Iterator[tuple[Location, Stat]]:
        import obstore

        prefix = f"{loc.key}/" if loc.key else None
        with _failures(loc, "list"):
            found = obstore.list_with_delimiter(self._store(loc), prefix)
        for meta in found["objects"]:
            if meta["path"] == loc.key:  # the folder's own marker
                continue
            stat = Stat(meta["size"], meta["last_modified"].timestamp(), meta["e_tag"])
            yield Location(f"s3://{loc.bucket}/{meta['path']}"), stat

    def write(self, loc: Location, data: bytes) -> None:
        import obstore

        with _failures(loc, "write"):
            obstore.put(self._store(loc), loc.key, data)

    def create(self, loc: Location, data: bytes) -> Stat:
        import obstore
        from obstore.exceptions import AlreadyExistsError as Exists
        from obstore.exceptions import PreconditionError

        try:
            with _failures(loc, "write"):
                done = obstore.put(self._store(loc), loc.key, data, mode="create")
        except (Exists, FileExistsError, PreconditionError):
            raise AlreadyExistsError(f"{loc} exists already") from None
        return Stat(len(data), _now_s(), done["e_tag"])

    def update(self, loc: Location, data: bytes, etag: str) -> Stat:
        import obstore
        from obstore.exceptions import AlreadyExistsError as Exists
        from obstore.exceptions import NotFoundError, PreconditionError

        try:
            with _failures(loc, "write"):
                done = obstore.put(self._store(loc), loc.key, data, mode={"e_tag": etag})
        # 412: another version; 404: gone; 409 (after object_store's retries, as
        # AlreadyExistsError): a concurrent conditional write won.
        except (PreconditionError, NotFoundError, FileNotFoundError, Exists, FileExistsError):
            raise ChangedError(f"{loc} is no longer version {etag}") from None
        return Stat(len(data), _now_s(), done["e_tag"])

    def store_time(self, loc: Location) -> float:
        # obstore does not give an answer's headers: the request is signed by it
        # (the same credentials and endpoint) and sent here. The Date is stamped by
        # the store's front end, whose clock its objects' times come from too (to
        # the second, as theirs: ``lease.STORE_TIME_GRAIN_S``).
        import urllib.error
        import urllib.request
        from email.utils import parsedate_to_datetime

        import obstore

        with _failures(loc, "sign a request for"):
            url = obstore.sign(self._store(loc), "HEAD", loc.key, CLOCK_READ_EXPIRY)
        request = urllib.request.Request(url, method="HEAD")
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                stamp = answer.headers.get("Date")
        except urllib.error.HTTPError as exc:  # 404, 403: still the store's answer
            stamp = exc.headers.get("Date")
        except (OSError, ValueError) as exc:
            raise StorageError(
                f"could not read the store's clock at {loc}: {exc} (check AWS_ENDPOINT_URL "
                "and that the store is reachable)"
            ) from None
        try:
            when = parsedate_to_datetime(stamp or "")
            # HTTP's dates are in GMT; one that does not say is read as such too.
            return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
        except (TypeError, ValueError):
            raise StorageError(
                f"the store's answer about {loc} carries no valid Date header ({stamp!r}): "
                "its clock cannot be read, so no age on it is judged"
            ) from None

    def open_reader(self, loc: Location) -> BinaryIO:
        import obstore
        from obstore.exceptions import NotFoundError

        try:
            with _failures(loc, "read"):
                raw = _SeekableReader(obstore.open_reader(self._store(loc), loc.key))
        except (FileNotFoundError, NotFoundError):
            raise FileNotFoundError(loc.uri) from None
        return io.BufferedReader(raw, buffer_size=256 * 1024)  # type: ignore[return-value]

    def land(self, local: Path, target: Location) -> None:
        import obstore

        try:
            with _failures(target, "write"):
                # One request, or a multipart upload for a large file: the object
                # appears only when it is complete.
                obstore.put(self._store(target), target.key, local)
        finally:
            local.unlink(missing_ok=True)

    def copy(self, source: Location, target: Location) -> None:
        import obstore

        if source.bucket != target.bucket:
            raise StorageError(f"cannot copy {source} to another bucket ({target})")
        with _failures(source, "copy"):
            obstore.copy(self._store(source), source.key, target.key)

    def move(self, source: Location, target: Location) -> None:
        self.copy(source, target)
        self.delete(source)

    def delete(self, loc: Location) -> None:
        import obstore
        from obstore.exceptions import NotFoundError

        with contextlib.suppress(FileNotFoundError, NotFoundError), _failures(loc, "delete"):
            obstore.delete(self._store(loc), loc.key)

    def delete_tree(self, loc: Location) -> None:
        import obstore

        store = self._store(loc)
        prefix = f"{loc.key}/" if loc.key else None
        with _failures(loc, "delete"):
            for chunk in obstore.list(store, prefix, chunk_size=1000):
                obstore.delete(store, [meta["path"] for meta in chunk])


class _SeekableReader(io.RawIOBase):
    """obstore's reader as the binary file pyarrow reads Parquet from."""

    def __init__(self, reader: Any) -> None:
        self._reader = reader

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return int(self._reader.seek(offset, whence))

    def tell(self) -> int:
        return int(self._reader.tell())

    def readinto(self, buffer: Any) -> int:
        data = memoryview(self._reader.read(len(buffer)))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._reader.close()
        super().close()


def parquet_dataset(files: Sequence[Location]) -> ds.Dataset:
    """Parquet files as one pyarrow dataset: local paths as they are, S3 objects
    read through this module's client (pyarrow asks for a file's size, then reads
    ranges of it)."""
    import pyarrow.dataset as ds

    if not any(f.is_s3 for f in files):
        return ds.dataset([f.uri for f in files], format="parquet")
    if not all(f.is_s3 for f in files):
        raise ValueError("a dataset of local and S3 files")
    return ds.dataset([f.uri for f in files], format="parquet", filesystem=_arrow_reads())


def parquet_rows(file: Location) -> int:
    """A Parquet file's row count, from its footer."""
    import pyarrow.parquet as pq

    with file.open_reader() as handle:
        return int(pq.read_metadata(handle).num_rows)


@cache
def _arrow_reads() -> PyFileSystem:
    """Reads of S3 objects for pyarrow, by URI; nothing else (the warehouse's writes
    go through ``Location``). Made on first use: pyarrow is not imported with this
    module (Airflow's DAG files import it)."""
    import pyarrow as pa
    from pyarrow.fs import FileInfo, FileSystemHandler, FileType, PyFileSystem

    def refused(*_args: Any, **_kwargs: Any) -> Any:
        raise NotImplementedError("pyarrow reads S3 objects only; writes go through Location")

    class Reads(FileSystemHandler):  # type: ignore[misc]
        get_file_info_selector = create_dir = delete_dir = delete_dir_contents = refused
        delete_root_dir_contents = delete_file = move = copy_file = refused
        open_output_stream = open_append_stream = refused

        def get_type_name(self) -> str:
            return "platform-s3"

        def normalize_path(self, path: str) -> str:
            return path

        def get_file_info(self, paths: list[str]) -> list[FileInfo]:
            found = []
            for path in paths:
                stat = Location.parse(path).stat()
                kind = FileType.NotFound if stat is None else FileType.File
                found.append(FileInfo(path, kind, size=None if stat is None else stat.size))
            return found

        def open_input_file(self, path: str) -> pa.PythonFile:
            return pa.PythonFile(Location.parse(path).open_reader(), mode="r")

        def open_input_stream(self, path: str) -> pa.PythonFile:
            return self.open_input_file(path)

        def __eq__(self, other: object) -> bool:
            return isinstance(other, Reads)

        def __ne__(self, other: object) -> bool:
            return not isinstance(other, Reads)

        def __hash__(self) -> int:
            return hash(Reads)

    return PyFileSystem(Reads())


def _now_s() -> float:
    import time

    return time.time()


_LOCAL, _S3 = _LocalFiles(), _S3Objects()


def _backend(loc: Location) -> _LocalFiles | _S3Objects:
    return _S3 if loc.is_s3 else _LOCAL


# The AWS variables a store is made from: a change (a test's other server, an
# Airflow connection applied to the environment) makes a new client.
AWS_VARIABLES = (
    "AWS_ENDPOINT_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ALLOW_HTTP",
)


def _s3_environment() -> tuple[tuple[str, str], ...]:
    return tuple((name, os.environ[name]) for name in AWS_VARIABLES if name in os.environ)


# The AWS variables that are credentials, and the S3A settings that hold them.
S3A_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "fs.s3a.access.key",
    "AWS_SECRET_ACCESS_KEY": "fs.s3a.secret.key",
    "AWS_SESSION_TOKEN": "fs.s3a.session.token",
}


def s3a_settings(environ: Mapping[str, str]) -> dict[str, str]:
    """Spark's S3A (hadoop-aws) configured from the same AWS variables as the
    platform's own client: the endpoint (path-style, TLS as its scheme says), the
    region and, when given, the keys. Without keys S3A's own chain applies (an
    instance profile, a web identity). Hadoop keys, without ``spark.hadoop.``."""
    # s3:// as well as s3a://: a table a pipeline names as s3://bucket/key (as delta-rs
    # and the AWS tools write it) is read through S3A too.
    found = {"fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem"}
    endpoint = environ.get("AWS_ENDPOINT_URL", "")
    if endpoint:
        found["fs.s3a.endpoint"] = endpoint
        found["fs.s3a.path.style.access"] = "true"
        found["fs.s3a.connection.ssl.enabled"] = str(endpoint.startswith("https:")).lower()
    region = environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION")
    if region:
        found["fs.s3a.endpoint.region"] = region
    for variable, key in S3A_CREDENTIALS.items():
        if environ.get(variable):
            found[key] = environ[variable]
    if environ.get("AWS_SESSION_TOKEN"):
        found["fs.s3a.aws.credentials.provider"] = (
            "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
        )
    return found


def aws_environment() -> dict[str, str]:
    """The AWS variables set in this process (what executors elsewhere are given)."""
    return dict(_s3_environment())


@cache
def _s3_store(bucket: str, environment: tuple[tuple[str, str], ...]) -> S3Store:
    """One client per bucket and configuration (its connections are pooled)."""
    from obstore.store import S3Store

    settings = dict(environment)
    return S3Store(
        bucket,
        # Path-style requests: what S3-compatible stores on premises serve.
        virtual_hosted_style_request=False,
        client_options={"allow_http": settings.get("AWS_ALLOW_HTTP", "").lower() == "true"},
        retry_config={"max_retries": 10, "retry_timeout": RETRY_TIMEOUT},
    )


@contextlib.contextmanager
def _failures(loc: Location, action: str) -> Iterator[None]:
    """obstore's errors other than the ones a caller handles (not found, exists,
    precondition) as one line naming the object and what to check."""
    from obstore.exceptions import (
        AlreadyExistsError as Exists,
    )
    from obstore.exceptions import (
        BaseError,
        NotFoundError,
        PermissionDeniedError,
        PreconditionError,
        UnauthenticatedError,
    )

    try:
        yield
    except (NotFoundError, FileNotFoundError, FileExistsError, Exists, PreconditionError):
        raise
    except (PermissionDeniedError, UnauthenticatedError) as exc:
        raise StorageError(
            f"the store refused to {action} {loc}: check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY "
            f"and the bucket's permissions ({_first_line(exc)})"
        ) from None
    except BaseError as exc:
        raise StorageError(
            f"could not {action} {loc}: {_first_line(exc)} (check AWS_ENDPOINT_URL and that the "
            "store is up)"
        ) from None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
