"""What the platform keeps between runs in the system's temporary directory (the
``jobs`` zip that executors import, the driver JVM's class-data-sharing archive):
each user's under ``<tmp>/platform-<uid>/``, a folder that user made and that no
one else can enter. A file another local user put in the temporary directory is
then never shipped to Spark nor mapped into a JVM, which would run their code as
this user. Each folder is checked, never followed: a link, another user's
folder or one that others may enter is refused with one line.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from jobs.errors import ConfigError

# Group and others may neither write a file nor enter (or list) a folder.
OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH
OTHERS_ANY = stat.S_IRWXG | stat.S_IRWXO


def private_dir(name: str) -> Path:
    """``<tmp>/platform-<uid>/<name>``: made owner-only (0700) where missing, checked
    where present. ``ConfigError``: a folder there is not this user's alone."""
    shared = Path(tempfile.gettempdir())
    _check_shared(shared)
    root = _own_folder(shared / f"platform-{os.getuid()}")
    return _own_folder(root / name)


def _check_shared(folder: Path) -> None:
    """Others may write in the temporary directory (/tmp): only its sticky bit stops
    them from renaming this user's folder away and putting theirs in its place."""
    mode = os.stat(folder).st_mode
    if mode & OTHERS_WRITE and not mode & stat.S_ISVTX:
        raise ConfigError(
            f"the temporary directory {folder} is writable by other users without the "
            "sticky bit (they could swap the platform's folder in it): set TMPDIR to a "
            "folder of your own"
        )


def _own_folder(path: Path) -> Path:
    with contextlib.suppress(FileExistsError):  # checked below, as a new one is
        path.mkdir(mode=0o700)
    found = os.lstat(path)
    mode = found.st_mode
    problem = (
        "is a symbolic link"
        if stat.S_ISLNK(mode)
        else "is not a folder"
        if not stat.S_ISDIR(mode)
        else f"belongs to another user (uid {found.st_uid})"
        if found.st_uid != os.getuid()
        else f"is open to other users (mode {stat.S_IMODE(mode):o})"
        if mode & OTHERS_ANY
        else ""
    )
    if problem:
        raise ConfigError(
            f"{path} {problem}: the platform keeps its files only in a folder of this "
            "user's alone (mode 700); remove it, or set TMPDIR to a folder of your own"
        )
    return path


def is_own(found: os.stat_result) -> bool:
    """Whether ``found`` (an ``lstat`` or ``fstat``) is a regular file of this user's
    that no one else may write."""
    return (
        stat.S_ISREG(found.st_mode)
        and found.st_uid == os.getuid()
        and not found.st_mode & OTHERS_WRITE
    )


def is_own_file(path: Path) -> bool:
    """``is_own`` of ``path`` itself (a link is not followed, and is no file of ours)."""
    try:
        return is_own(os.lstat(path))
    except FileNotFoundError:
        return False
