"""The package executors import: a zip of ``jobs`` that works with nothing else on
the path, and the executors' Python chosen by the setting or the master."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

from jobs.errors import ConfigError
from jobs.package import package_zip
from jobs.settings import REPO_ROOT
from jobs.streaming.spark import CLUSTER_PYTHON, executor_python


def test_the_zip_alone_imports_what_executors_run() -> None:
    archive = package_zip()
    assert "jobs/__init__.py" in zipfile.ZipFile(archive).namelist()  # zipimport: no namespaces
    code = (
        # Executors read Kafka through Spark's JVM source: no Kafka client in Python.
        "import sys; sys.modules['confluent_kafka'] = None; sys.path.insert(0, sys.argv[1]); "
        "import jobs.streaming.seed, jobs.errors; "
        "import jobs.streaming.changelog_files; "
        "print(jobs.streaming.changelog_files.__file__)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(archive)],
        cwd=tempfile.gettempdir(),  # not the project: only the zip can provide ``jobs``
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith(str(archive))


def test_the_zip_is_named_by_its_content() -> None:
    assert package_zip() == package_zip()
    assert package_zip().name.startswith("jobs-")


def test_executors_python() -> None:
    assert executor_python("local[2]", None) == sys.executable
    assert executor_python("spark://h:7077", None) == CLUSTER_PYTHON
    assert executor_python("spark://h:7077", "/opt/py/bin/python3") == "/opt/py/bin/python3"
    assert executor_python("local[*]", "/opt/py/bin/python3") == "/opt/py/bin/python3"


# What executors import must be the platform's own code: the zip is kept in a
# folder only this user can enter, and checked against ``jobs/`` before reuse.


@pytest.fixture
def temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A system temporary directory of the test's own (sticky, as /tmp is)."""
    tmp_path.chmod(0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def assert_is_the_package(archive: Path) -> None:
    sources = sorted(p for p in (REPO_ROOT / "jobs").rglob("*.py") if "__pycache__" not in p.parts)
    with zipfile.ZipFile(archive) as opened:
        members = {name: opened.read(name) for name in opened.namelist()}
    assert members == {str(p.relative_to(REPO_ROOT)): p.read_bytes() for p in sources}


def test_the_zip_lives_in_a_folder_only_its_user_can_enter(temp: Path) -> None:
    archive = package_zip()
    assert_is_the_package(archive)
    for folder in (archive.parent, *archive.parent.parents):
        if folder == temp:
            break
        found = os.lstat(folder)
        assert not stat.S_ISLNK(found.st_mode) and found.st_uid == os.getuid()
        assert stat.S_IMODE(found.st_mode) & 0o077 == 0, f"{folder}: {oct(found.st_mode)}"
    else:
        raise AssertionError(f"{archive} is not under the temporary directory {temp}")
    assert stat.S_IMODE(os.lstat(archive).st_mode) & 0o022 == 0
    assert sorted(p.name for p in archive.parent.iterdir()) == [archive.name]  # no partial left


def test_a_zip_whose_content_is_not_the_package_is_built_again(temp: Path) -> None:
    archive = package_zip()
    with zipfile.ZipFile(archive, "w") as planted:
        planted.writestr("jobs/__init__.py", "import os; os.system('touch /tmp/owned')\n")
        planted.writestr("jobs/streaming/__init__.py", "")
    assert package_zip() == archive
    assert_is_the_package(archive)
    archive.write_bytes(b"not a zip")
    assert_is_the_package(package_zip())


def test_a_zip_others_may_write_is_never_shipped(temp: Path) -> None:
    archive = package_zip()
    archive.chmod(0o666)
    again = package_zip()
    assert stat.S_IMODE(os.lstat(again).st_mode) & 0o022 == 0
    assert_is_the_package(again)
    again.unlink()
    elsewhere = temp / "elsewhere.zip"
    elsewhere.write_bytes(b"planted")
    again.symlink_to(elsewhere)  # a link in its place is replaced, not followed
    assert not package_zip().is_symlink()
    assert elsewhere.read_bytes() == b"planted"
    assert_is_the_package(package_zip())


def test_a_folder_of_another_user_is_refused_with_one_line(
    temp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another local user made the folder first (here: this process, for a user
    of the next uid), to put a zip of theirs in it."""
    user = os.geteuid() + 1
    planted = temp / f"platform-{user}"
    planted.mkdir(mode=0o700)
    monkeypatch.setattr(os, "getuid", lambda: user)
    with pytest.raises(ConfigError, match="another user") as refused:
        package_zip()
    assert "\n" not in str(refused.value) and str(planted) in str(refused.value)
    assert list(planted.iterdir()) == []


def test_a_folder_replaced_by_a_link_or_opened_to_others_is_refused(temp: Path) -> None:
    folder = package_zip().parent
    planted = temp / "planted"
    shutil.copytree(folder, planted)
    shutil.rmtree(folder)
    folder.symlink_to(planted)
    with pytest.raises(ConfigError, match="link"):
        package_zip()
    folder.unlink()
    folder.mkdir()
    folder.chmod(0o777)
    with pytest.raises(ConfigError, match="other users"):
        package_zip()


def test_a_temporary_directory_anyone_may_rename_in_is_refused(temp: Path) -> None:
    temp.chmod(0o777)  # world-writable without the sticky bit: folders can be swapped
    with pytest.raises(ConfigError, match="TMPDIR"):
        package_zip()
