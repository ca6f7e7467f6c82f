"""The driver JVM's class-data-sharing archive: dumped by a first run, mapped later,
never read half-written."""

from __future__ import annotations

import os
import stat
import tempfile
import time
from pathlib import Path

import pytest

from jobs.streaming import jvm


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(jvm, "archive_dir", lambda: tmp_path)
    monkeypatch.delenv(jvm.ENV, raising=False)
    return tmp_path


def test_a_first_run_dumps_under_its_own_name(folder: Path) -> None:
    options = jvm.cds_options()
    assert f"-XX:ArchiveClassesAtExit={folder}" in options and f".{os.getpid()}.jsa" in options
    assert "-Xshare:auto" in options  # a foreign or stale archive is refused, not fatal


def test_a_settled_dump_of_a_dead_run_becomes_the_archive(folder: Path) -> None:
    dead = 2**22 + 12345  # no such pid
    dump = folder / f"spark-{jvm._key()}.{dead}.jsa"
    dump.write_bytes(b"x" * 10)
    jvm._ran(dump).touch()  # its run ran a pipeline to the end
    assert jvm.cds_options() == ""  # maybe still being written: no second dump, no map
    old = time.time() - jvm.DUMP_SETTLE_S - 5
    os.utime(dump, (old, old))
    options = jvm.cds_options()
    assert f"-XX:SharedArchiveFile={folder / f'spark-{jvm._key()}.jsa'}" in options
    assert not dump.exists() and not jvm._ran(dump).exists()
    spare = folder / f"spark-{jvm._key()}.{dead + 1}.jsa"
    spare.write_bytes(b"y")
    jvm._ran(spare).touch()
    os.utime(spare, (old, old))
    jvm.cds_options()
    assert not spare.exists()  # a second finished dump is removed, not kept
    assert not jvm._ran(spare).exists()


def test_the_dump_of_a_process_that_ran_no_pipeline_is_discarded(folder: Path) -> None:
    """The first JVM to exit wrote the archive for good: a command refused once
    Spark was up left a fifth of the classes in it, and every cold run was slower."""
    dump = folder / f"spark-{jvm._key()}.{2**22 + 12345}.jsa"  # no such pid
    dump.write_bytes(b"a few classes")
    old = time.time() - jvm.DUMP_SETTLE_S - 5
    os.utime(dump, (old, old))
    options = jvm.cds_options()
    assert "SharedArchiveFile" not in options and "-XX:ArchiveClassesAtExit" in options
    assert not dump.exists() and not (folder / f"spark-{jvm._key()}.jsa").exists()


def test_a_run_that_ends_well_notes_it_beside_its_dump(folder: Path) -> None:
    options = jvm.cds_options()
    dump = Path(options.split("-XX:ArchiveClassesAtExit=")[1].split()[0])
    jvm.note_a_complete_run()
    assert jvm._ran(dump).exists()


def test_notes_and_aot_configurations_of_killed_runs_are_removed(folder: Path) -> None:
    old = time.time() - jvm.DUMP_SETTLE_S - 5
    dead = 2**22 + 12345
    left = [
        folder / f"spark-{jvm._key()}.{dead}.jsa.ran",  # the run noted, its JVM was killed
        folder / f"spark-00000000000000aa.{dead}.aot.config",  # killed while it assembled
    ]
    alive = folder / f"spark-00000000000000bb.{os.getpid()}.aot.config"  # still assembling
    for path in [*left, alive]:
        path.write_bytes(b"x")
        os.utime(path, (old, old))
    jvm.prune_other_archives(folder, jvm._key())
    assert not any(p.exists() for p in left) and alive.exists()


def test_it_can_be_turned_off(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(jvm.ENV, "off")
    assert jvm.cds_options() == ""
    assert "log4j" in jvm.driver_java_options()


def test_a_jar_rebuilt_in_place_gets_a_new_archive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """make setup rebuilds platform-sources.jar under the same name; the JVM would
    refuse the old archive for good and start without one."""
    jar = tmp_path / "platform-sources.jar"
    jar.write_bytes(b"one")
    monkeypatch.setattr("jobs.jars.spark_jars", lambda: [jar])
    before = jvm._key()
    jar.write_bytes(b"two, longer")
    assert jvm._key() != before


def test_writing_a_new_archive_keeps_only_the_newest_few_of_other_jar_sets(
    folder: Path,
) -> None:
    others = [folder / f"spark-{n:016x}.jsa" for n in range(6)]
    for age, path in enumerate(others):
        path.write_bytes(b"x")
        os.utime(path, (time.time() - 1000 * age, time.time() - 1000 * age))
    dumping = folder / f"spark-00000000000000aa.{os.getpid()}.jsa"  # another key's, writing
    dumping.write_bytes(b"x")
    spare = folder / f"spark-00000000000000bb.{2**22 + 12345}.jsa"  # another key's, writer gone
    spare.write_bytes(b"x")
    old = time.time() - jvm.DUMP_SETTLE_S - 5
    os.utime(spare, (old, old))
    os.utime(dumping, (old, old))
    assert "-XX:ArchiveClassesAtExit" in jvm.cds_options()
    kept = sorted(p.name for p in folder.glob("spark-*.jsa"))
    assert kept == sorted([p.name for p in others[: jvm.KEEP_OTHER_ARCHIVES]] + [dumping.name])


def test_another_keys_finished_dump_waits_for_its_next_run(folder: Path) -> None:
    """Runs on Java 17 and Java 25 by turns (two keys): the dump a Java 25 run left,
    which the next Java 25 run adopts, is no spare for a Java 17 run to remove."""
    old = time.time() - jvm.DUMP_SETTLE_S - 5
    waiting = folder / f"spark-00000000000000cc.{2**22 + 12345}.aot"  # writer gone
    waiting.write_bytes(b"x")
    jvm._ran(waiting).touch()  # its run ran a pipeline to the end
    spare = folder / f"spark-00000000000000dd.{2**22 + 12346}.jsa"  # its key has an archive
    spare.write_bytes(b"x")
    jvm._ran(spare).touch()
    (folder / "spark-00000000000000dd.jsa").write_bytes(b"x")
    for path in (waiting, jvm._ran(waiting), spare, jvm._ran(spare)):
        os.utime(path, (old, old))
    assert "-XX:ArchiveClassesAtExit" in jvm.cds_options()
    assert waiting.exists() and jvm._ran(waiting).exists()
    assert not spare.exists() and not jvm._ran(spare).exists()


def test_the_users_options_come_after_the_platforms(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(jvm.EXTRA_ENV, "-XX:TieredStopAtLevel=1 -Dx=y")
    options = jvm.driver_java_options()
    assert options.startswith("-Dlog4j.configurationFile=")
    assert options.endswith(" -XX:TieredStopAtLevel=1 -Dx=y")
    # Deep recursions (java.util.regex) get room; a user's own -Xss comes later and wins.
    assert options.index(jvm.THREAD_STACK) < options.index("-XX:TieredStopAtLevel=1")
    monkeypatch.delenv(jvm.EXTRA_ENV)
    assert "TieredStopAtLevel" not in jvm.driver_java_options()


def test_an_archive_another_run_removed_meanwhile_is_skipped(folder: Path) -> None:
    """Runs of one key prune at once: a file listed, then gone, is no error."""
    (folder / "spark-00000000000000cc.jsa").symlink_to(folder / "gone.jsa")  # stat: not found
    (folder / f"spark-00000000000000dd.{2**22 + 12345}.jsa").symlink_to(folder / "gone.jsa")
    jvm.prune_other_archives(folder, "0000000000000000")


def test_two_runs_that_both_find_a_finished_dump_start_alike(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two test workers started Spark at once: both found a dead run's finished
    dump, one moved it into place first, the other's move failed (seen in CI:
    FileNotFoundError at session start). The second maps the archive the first
    put in place."""
    dump = folder / f"spark-{jvm._key()}.{2**22 + 12345}.jsa"  # no such pid
    dump.write_bytes(b"archive")
    jvm._ran(dump).touch()
    old = time.time() - 3600
    os.utime(dump, (old, old))
    original = Path.replace

    def moved_first(self: Path, target: Path) -> Path:  # the other run wins the race
        original(self, target)
        return original(self, target)

    monkeypatch.setattr(Path, "replace", moved_first)
    final = folder / f"spark-{jvm._key()}.jsa"
    assert f"-XX:SharedArchiveFile={final}" in jvm.cds_options()


def test_a_file_whose_name_does_not_parse_is_ignored(folder: Path) -> None:
    """A planted spark-<key>.x.jsa made every run fail in int()."""
    old = time.time() - jvm.DUMP_SETTLE_S - 5
    for name in (f"spark-{jvm._key()}.x.jsa", f"spark-{jvm._key()}..jsa", "spark-x.1.2.jsa"):
        (folder / name).write_bytes(b"x")
        os.utime(folder / name, (old, old))
    options = jvm.cds_options()
    assert f"-XX:ArchiveClassesAtExit={folder}" in options
    other = folder / "spark-00000000000000ee.x.jsa"  # another key's
    other.write_bytes(b"x")
    os.utime(other, (old, old))
    jvm.prune_other_archives(folder, jvm._key())
    assert other.exists()  # not the platform's name: neither read nor removed


def test_an_archive_others_may_write_or_a_link_is_never_mapped(folder: Path) -> None:
    final = folder / f"spark-{jvm._key()}.jsa"
    final.write_bytes(b"archive")
    final.chmod(0o666)
    options = jvm.cds_options()
    assert "SharedArchiveFile" not in options and "-XX:ArchiveClassesAtExit" in options
    assert not final.exists()  # removed: this run writes a new one
    elsewhere = folder.parent / "planted.jsa"
    elsewhere.write_bytes(b"archive")
    final.symlink_to(elsewhere)
    options = jvm.cds_options()
    assert "SharedArchiveFile" not in options and str(elsewhere) not in options
    assert elsewhere.read_bytes() == b"archive"


def test_files_of_another_user_are_never_adopted(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = jvm._key()
    dump = folder / f"spark-{key}.{2**22 + 12345}.jsa"  # a dead run's, settled
    dump.write_bytes(b"archive")
    jvm._ran(dump).touch()
    old = time.time() - 3600
    os.utime(dump, (old, old))
    final = folder / f"spark-{key}.jsa"
    with monkeypatch.context() as other_user:
        other_user.setattr(os, "getuid", lambda: os.geteuid() + 1)  # the files are not theirs
        options = jvm.cds_options()
    assert "SharedArchiveFile" not in options and not final.exists()
    assert f"-XX:SharedArchiveFile={final}" in jvm.cds_options()  # its own user's: adopted


def test_the_archive_folder_is_its_users_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tmp_path.chmod(0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv(jvm.ENV, raising=False)
    folder = jvm.archive_dir()
    found = os.lstat(folder)
    assert found.st_uid == os.getuid() and stat.S_IMODE(found.st_mode) & 0o077 == 0
    # Another user's folder (here: a link to one) in its place: no archive is mapped
    # from it or dumped into it; the run starts without one.
    planted = tmp_path / "planted"
    planted.mkdir()
    (planted / f"spark-{jvm._key()}.jsa").write_bytes(b"archive")
    folder.rmdir()
    folder.symlink_to(planted)
    assert jvm.cds_options() == ""
    assert sorted(p.name for p in planted.iterdir()) == [f"spark-{jvm._key()}.jsa"]


def fake_jdk(root: Path, version: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "release").write_text(f'IMPLEMENTOR="x"\nJAVA_VERSION="{version}"\n')
    return root


@pytest.mark.parametrize(
    ("version", "feature", "suffix"),
    [("1.8.0_402", 8, "jsa"), ("17.0.15", 17, "jsa"), ("24", 24, "jsa"), ("25.0.3", 25, "aot")],
)
def test_java_25_writes_and_maps_an_aot_cache_in_place_of_the_archive(
    folder: Path, monkeypatch: pytest.MonkeyPatch, version: str, feature: int, suffix: str
) -> None:
    home = fake_jdk(folder.parent / f"jdk-{feature}", version)
    monkeypatch.setenv("JAVA_HOME", str(home))
    assert jvm.java_feature(home) == feature
    dump = jvm.cds_options()
    written = {"jsa": "-XX:ArchiveClassesAtExit", "aot": "-XX:AOTCacheOutput"}[suffix]
    assert f"{written}={folder}/spark-{jvm._key()}.{os.getpid()}.{suffix}" in dump
    (folder / f"spark-{jvm._key()}.{suffix}").write_bytes(b"archive")
    mapped = {"jsa": "-XX:SharedArchiveFile", "aot": "-XX:AOTCache"}[suffix]
    assert f"{mapped}={folder}/spark-{jvm._key()}.{suffix}" in jvm.cds_options()
    if suffix == "aot":  # what the JVM says while it writes the cache stays off stdout
        assert "-XX:+DisplayVMOutputToStderr" in dump


def test_a_jdk_without_a_readable_release_file_keeps_the_archive(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JAVA_HOME", str(folder.parent / "no-such-jdk"))
    assert jvm.java_feature(folder.parent / "no-such-jdk") is None
    assert "-XX:ArchiveClassesAtExit" in jvm.cds_options()


def test_other_java_options_get_another_archive(monkeypatch: pytest.MonkeyPatch) -> None:
    """An AOT cache written under other JIT or GC options may be refused for good."""
    monkeypatch.delenv(jvm.EXTRA_ENV, raising=False)
    plain = jvm._key()
    monkeypatch.setenv(jvm.EXTRA_ENV, "-XX:TieredStopAtLevel=1")
    assert jvm._key() != plain
