"""``jobs/`` as the code a run ships: its content digest (a warm driver and its
client compare them) and its zip for executors' ``sys.path``. Without Spark, so that
a warm driver's client imports none."""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import zipfile
from collections.abc import Iterable
from pathlib import Path

from jobs.private_dir import is_own, private_dir
from jobs.settings import REPO_ROOT

PACKAGE = REPO_ROOT / "jobs"
ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest a zip can say
log = logging.getLogger(__name__)


def _sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _members() -> list[tuple[str, bytes]]:
    """``jobs/``'s files as the zip holds them: (path under the project, content)."""
    return [(str(path.relative_to(REPO_ROOT)), path.read_bytes()) for path in _sources()]


def _content_digest(members: Iterable[tuple[str, bytes]]) -> str:
    """A hash of (name, content) pairs, each length-prefixed: no other set of files
    (one file holding the next one's name and text, say) has the same."""
    digest = hashlib.sha256()
    for name, data in members:
        encoded = name.encode()
        for part in (encoded, data):
            digest.update(len(part).to_bytes(8, "big") + part)
    return digest.hexdigest()[:16]


def package_digest() -> str:
    """What code ``jobs/`` holds (a content hash): the zip's name, and how a warm
    driver and its client tell that they run the same code."""
    return _content_digest(_members())


def package_zip() -> Path:
    """``jobs/`` as a zip for executors' ``sys.path``, named by its content and kept
    in this user's own folder (``jobs/private_dir.py``). An archive found there is
    shipped only if it is this user's own file, no one else may write it, and it
    holds exactly what its name says; else it is built again (atomically)."""
    members = _members()  # read once: the name and the archive are of the same bytes
    digest = _content_digest(members)
    target = private_dir("py-files") / f"jobs-{digest}.zip"
    problem = _archive_problem(target, digest)
    if problem is None:
        return target
    if problem:
        log.warning("not shipping %s (%s): building it again", target, problem)
    descriptor, partial = tempfile.mkstemp(dir=target.parent, prefix=target.name, suffix=".partial")
    try:
        with (
            os.fdopen(descriptor, "wb") as handle,
            zipfile.ZipFile(handle, "w", zipfile.ZIP_DEFLATED) as archive,
        ):
            for name, data in members:
                # Fixed time and mode: the archive depends on the sources alone.
                info = zipfile.ZipInfo(name, date_time=ZIP_TIME)
                info.external_attr = 0o644 << 16
                archive.writestr(info, data, zipfile.ZIP_DEFLATED)
        os.replace(partial, target)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise
    return target


def _archive_problem(path: Path, digest: str) -> str | None:
    """None when ``path`` is this user's own archive of exactly the sources of
    ``digest``; else why not ("": there is none)."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return ""
    except OSError as exc:  # ELOOP: a link in its place
        return f"cannot open it without following a link: {exc.strerror}"
    with os.fdopen(descriptor, "rb") as handle:
        if not is_own(os.fstat(descriptor)):
            return "not a file of this user's alone"
        try:
            with zipfile.ZipFile(handle) as archive:
                found = _content_digest((i.filename, archive.read(i)) for i in archive.infolist())
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
            return f"not a readable zip: {exc}"
    return None if found == digest else f"it holds other code ({found})"
