"""JVM start-up: a class-data-sharing (AppCDS) archive of the classes Spark loads.

A cold ``spark-submit`` spends seconds loading and verifying Spark's classes. The
first run dumps the classes it loaded into an archive when its JVM exits; later
runs map it and start about 2 s sooner (measured: session ready in 4.0-4.3 s
instead of 6.1 s on 2 cores). The platform's jars are on the driver's class path
too, so Delta's classes, which a session loads at start, are in the archive
(with them: session 3.6-4.2 s instead of 5.7-5.9 s, the first Delta write 5.6 s
instead of 7.3 s). Only the dump of a process that ran a pipeline to the end
becomes the archive (``note_a_complete_run``): a short command loads a fraction of
the classes. The archive is keyed by the Java, Spark and driver
JVM options in use, written under a per-process name and renamed into place only
once complete, so concurrent runs never read a half-written archive. It lives in this user's own
folder (``<tmp>/platform-<uid>/jvm``, ``jobs/private_dir.py``): a JVM maps only
an archive that is this user's file and that no one else may write (another
user's would run their code here), and files of other names are left alone. A
stale archive is refused by the JVM itself, which then starts without it
(``-Xshare:auto``). ``PLATFORM_SPARK_CDS=off`` disables it.
``PLATFORM_SPARK_JAVA_OPTIONS`` adds options of the user's
(``-XX:TieredStopAtLevel=1``, the JIT's first tier only, made a cold
2,000-record run 23% faster and a cold 1M-event batch 10% slower).

On Java 25 and later the archive is an AOT cache instead (JEP 483/514/515: the
classes loaded and linked, and the methods' profiles, so the JIT compiles sooner),
with the same life: the first run writes it as its JVM exits
(``-XX:AOTCacheOutput``), later runs map it (``-XX:AOTCache``). Measured on a cold
1M-event run: 26.2 s on Java 25 with its cache against 30.3 s on Java 17 with its
archive (docs/benchmarks.md). Which Java runs the driver is Spark's choice:
``JAVA_HOME``, else ``java`` on the ``PATH``.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import psutil
import pyspark

from jobs.errors import ConfigError
from jobs.private_dir import is_own_file, private_dir
from jobs.settings import REPO_ROOT, java_options, spark_cds

log = logging.getLogger(__name__)
ENV = "PLATFORM_SPARK_CDS"
# More driver JVM options, after the platform's (the platform sets
# spark.driver.extraJavaOptions, so a spark-defaults value would be replaced).
EXTRA_ENV = "PLATFORM_SPARK_JAVA_OPTIONS"
LOG4J_CONFIG = REPO_ROOT / "include" / "config" / "log4j2.properties"
# The JVM writes the archive while it exits, after the Python process that
# started it: a dump is taken as complete only once it has not changed for this long.
DUMP_SETTLE_S = 60.0
# Archives of other jar sets (other checkouts, older setups) kept when a new one is
# written: about 190 MB each, and every rebuilt jar set makes another.
KEEP_OTHER_ARCHIVES = 3
# spark-<key>.jsa (.aot), an archive; spark-<key>.<pid>.jsa (.aot), a run's dump (any
# other name in the folder is not the platform's: it is neither read nor removed).
ARCHIVE_NAME = re.compile(
    r"spark-(?P<key>[0-9a-f]{16})(?:\.(?P<pid>[0-9]{1,10}))?\.(?P<suffix>jsa|aot)"
)
# spark-<key>.<pid>.jsa.ran: that dump's process ran a pipeline to the end.
RAN = ".ran"
# The dump this process's JVM writes at exit, if it writes one.
_dumping_to: Path | None = None
# The first Java whose JVM writes an AOT cache as it exits (JEP 514).
AOT_FROM_JAVA = 25


@dataclass(frozen=True)
class ArchiveFormat:
    """How one Java maps an archive and writes one at exit."""

    suffix: Literal["jsa", "aot"]
    map_option: str
    dump_option: str
    # Silent whatever happens: a stale or foreign archive is refused and the JVM
    # starts without it; what the JVM says while writing one goes to stderr.
    quiet: str


CDS = ArchiveFormat(
    "jsa",
    "-XX:SharedArchiveFile",
    "-XX:ArchiveClassesAtExit",
    "-Xshare:auto -Xlog:cds=off,cds+dynamic=off",
)
AOT = ArchiveFormat(
    "aot",
    "-XX:AOTCache",
    "-XX:AOTCacheOutput",
    "-Xlog:aot=off,cds=off -XX:+DisplayVMOutputToStderr",
)


def java_home() -> Path:
    """The Java Spark starts the driver with: ``JAVA_HOME``, else ``java`` on the PATH."""
    home = os.environ.get("JAVA_HOME")
    if home:
        return Path(home)
    return Path(os.path.realpath(shutil.which("java") or "java")).parent.parent


def java_feature(home: Path) -> int | None:
    """The feature release (17, 25) a JDK's ``release`` file names; None if unreadable."""
    try:
        text = (home / "release").read_text(errors="replace")
    except OSError:
        return None
    found = re.search(r'^JAVA_VERSION="(?:1\.)?(\d+)', text, re.MULTILINE)
    return int(found[1]) if found else None


def archive_format(home: Path) -> ArchiveFormat:
    feature = java_feature(home)
    return AOT if feature is not None and feature >= AOT_FROM_JAVA else CDS


def _key() -> str:
    java = java_home()
    # The driver's class path is part of an archive's identity: a changed jar set
    # needs a new archive (the JVM would refuse the old one for good).
    from jobs.jars import spark_jars

    # A jar rebuilt in place (make setup) keeps its name: its size and time count too
    # (the JVM refuses an archive whose jars changed, and would start without it).
    jars = "|".join(
        sorted(f"{jar}:{jar.stat().st_size}:{jar.stat().st_mtime_ns}" for jar in spark_jars())
    )
    # The user's options too: an AOT cache written under other JIT or GC options may
    # be refused for good (and its profiles are theirs).
    options = java_options("SPARK_JAVA_OPTIONS")
    identity = f"{java}|{pyspark.__version__}|{Path(pyspark.__file__).parent}|{jars}|{options}"
    return hashlib.sha256(identity.encode()).hexdigest()[:16]


def archive_name() -> str:
    """The name of the archive this checkout's driver JVM maps, in ``archive_dir``:
    its key covers the JDK, Spark, the jars and the user's options."""
    return _archive_name(_key(), archive_format(java_home()))


def _archive_name(key: str, kind: ArchiveFormat) -> str:
    return f"spark-{key}.{kind.suffix}"


def archive_dir() -> Path:
    """This user's own folder for archives (``jobs/private_dir.py``): an archive
    another user could write would run their code in every driver JVM."""
    return private_dir("jvm")


def _parse(name: str) -> tuple[str, int | None] | None:
    """(key, writer's pid) of ``spark-<key>.jsa`` (pid None: an archive) or of a
    dump ``spark-<key>.<pid>.jsa`` (or ``.aot``); None for any other name (left alone)."""
    found = ARCHIVE_NAME.fullmatch(name)
    if found is None:
        return None
    return found["key"], int(found["pid"]) if found["pid"] else None


def cds_options() -> str:
    """Driver JVM options: map the archive, or dump one at exit if there is none."""
    if not spark_cds():
        return ""
    try:
        folder = archive_dir()
    except ConfigError as exc:  # the archive only saves time: start without one
        log.warning("no class-data-sharing archive: %s", exc)
        return ""
    key, kind = _key(), archive_format(java_home())
    final = folder / _archive_name(key, kind)
    if os.path.lexists(final) and not is_own_file(final):
        log.warning("removing %s: not a file of this user's alone", final)
        final.unlink(missing_ok=True)
    dumping = False
    for dump in folder.glob(f"spark-{key}.*.{kind.suffix}"):
        parsed = _parse(dump.name)
        if parsed is None or parsed[1] is None:
            continue  # not a dump's name: nothing of the platform's
        pid = parsed[1]
        try:
            found = os.lstat(dump)
            if not stat.S_ISREG(found.st_mode) or found.st_uid != os.getuid():
                continue  # never adopted, nor taken for a run's dump in progress
            settled = time.time() - found.st_mtime > DUMP_SETTLE_S
            if psutil.pid_exists(pid) or not settled:
                dumping = True  # another run is writing one: do not write a second
            elif final.exists() or found.st_size == 0 or not _ran(dump).exists():
                # A spare, an empty dump, or the classes of a process that ran no
                # pipeline to the end (a short command loads a fraction of them).
                dump.unlink(missing_ok=True)
                _ran(dump).unlink(missing_ok=True)
            else:  # a finished dump of an earlier run, written under the user's umask
                dump.chmod(0o600)
                dump.replace(final)
                _ran(dump).unlink(missing_ok=True)
        except FileNotFoundError:
            continue  # another run starting at the same time moved or removed it
    if is_own_file(final):
        return f"{kind.quiet} {kind.map_option}={final}"
    if dumping:
        return ""
    prune_other_archives(folder, key)
    log.info("no class-data-sharing archive yet: this run writes one at exit")
    global _dumping_to
    _dumping_to = folder / f"spark-{key}.{os.getpid()}.{kind.suffix}"
    return f"{kind.quiet} {kind.dump_option}={_dumping_to}"


def _ran(dump: Path) -> Path:
    """The marker that ``dump``'s process did a run's work (``note_a_complete_run``)."""
    return dump.with_name(dump.name + RAN)


def note_a_complete_run() -> None:
    """This process ran a pipeline (or a backfill) to the end: the archive its JVM
    writes at exit holds the classes a run loads, and may be adopted. A dump
    without this note is discarded: the first JVM to exit used to write the
    archive for good, whatever it had loaded (a short command, one refused once
    Spark was up). Seen here: a 34 MB archive, not 190 MB, and every later cold
    2,000-record run took 31.9 s instead of 14.9 s."""
    if _dumping_to is not None:
        with contextlib.suppress(OSError):
            _ran(_dumping_to).touch(mode=0o600)


def prune_other_archives(folder: Path, key: str) -> None:
    """Delete all but the newest few archives of other keys (a JVM that maps one
    keeps its mapping; a checkout that still uses it writes it again), and other
    keys' dumps whose writer is gone and that no run of theirs will adopt (two runs
    that exit together both dump; a run that ran no pipeline to the end).
    Runs of the same key may prune at once: a file gone meanwhile is skipped."""
    for companion in [*folder.glob(f"spark-*{RAN}"), *folder.glob("spark-*.aot.config")]:
        # A run's note, or the AOT cache's configuration its JVM writes before the
        # cache: left behind when the JVM was killed before it wrote the dump.
        parsed = _parse(companion.name.removesuffix(RAN).removesuffix(".config"))
        if parsed is None or parsed[1] is None:
            continue
        try:
            settled = time.time() - companion.stat().st_mtime > DUMP_SETTLE_S
        except FileNotFoundError:
            continue
        dump = companion.with_name(companion.name.removesuffix(RAN).removesuffix(".config"))
        if settled and not psutil.pid_exists(parsed[1]) and not dump.exists():
            companion.unlink(missing_ok=True)
    others: list[tuple[float, Path]] = []
    for path in [*folder.glob("spark-*.jsa"), *folder.glob("spark-*.aot")]:
        parsed = _parse(path.name)
        if parsed is None or parsed[0] == key:
            continue
        try:
            modified = path.stat().st_mtime
        except FileNotFoundError:
            continue
        pid = parsed[1]
        if pid is None:
            others.append((modified, path))
            continue
        settled = time.time() - modified > DUMP_SETTLE_S
        # A finished run's dump waits for the next run of its key (Java 17 and 25
        # by turns) unless that key has its archive already.
        archive = path.with_name(f"spark-{parsed[0]}.{path.suffix.lstrip('.')}")
        waiting = _ran(path).exists() and not archive.exists()
        if settled and not psutil.pid_exists(pid) and not waiting:
            path.unlink(missing_ok=True)
            _ran(path).unlink(missing_ok=True)
    others.sort(reverse=True)
    for _modified, stale in others[KEEP_OTHER_ARCHIVES:]:
        log.info("removing an old class-data-sharing archive: %s", stale.name)
        stale.unlink(missing_ok=True)


# The stack of every thread the driver's JVM starts (Java's default: 1 MB). A fenced
# continuous stream's execution thread once died of a StackOverflowError deep in
# java.util.regex (1,024 frames of it, the caller not among them) and the run never
# ended; a recursive match needs stack in proportion to its input. A mitigation: what
# ran that match is not known yet. Reserved, not committed: a thread uses what it
# touches.
THREAD_STACK = "-Xss4m"


# How long a driver JVM lives: "short", a command that ends by itself (a scheduled
# available-now run, a backfill, a check); "long", a continuous run or a warm driver.
Lifetime = Literal["short", "long"]
# HotSpot compiler directives for a short process: the JIT's second tier (C2) does not
# compile code that runs while a query starts and is planned, never per record:
# Spark's SQL parser (ANTLR), analyser and optimiser, code generation (Janino), the
# closure cleaner's and the JDK's bytecode tools, lambda linkage, class loading, Java
# serialization, JSON of progress and logs, py4j. That code runs at C1's optimised
# tier instead. Measured on a cold 1M-event run (docs/benchmarks.md): C2 had one
# thread busy for the whole run, 15.7 s of its 50 s of CPU, and its queue never
# emptied; with these directives C2 took 10.7 s, and the per-record code (the Kafka
# client, JSON parsing, generated code) got compiled sooner. A long process keeps
# C2 for all of it: planning every batch, for hours, on C1's code would cost more.
JIT_DIRECTIVES = REPO_ROOT / "include" / "jvm" / "jit_directives.json"


def jit_options(lifetime: Lifetime) -> str:
    """The JIT's options for a driver JVM of that lifetime (the file must exist on
    the driver's machine: a JVM that cannot read it does not start). The JVM says
    how many directives it read on stderr: a command's stdout is its own."""
    if lifetime == "long":
        return ""
    return (
        "-XX:+UnlockDiagnosticVMOptions -XX:+DisplayVMOutputToStderr "
        f"-XX:CompilerDirectivesFile={JIT_DIRECTIVES}"
    )


def driver_java_options(lifetime: Lifetime = "long") -> str:
    """Every driver JVM's options: the platform's log config, the thread stack, the
    JIT's directives for a short process, the archive, then the user's."""
    extra = java_options("SPARK_JAVA_OPTIONS")
    return (
        f"-Dlog4j.configurationFile={LOG4J_CONFIG} {THREAD_STACK} {jit_options(lifetime)} "
        f"{cds_options()} {extra}"
    ).strip()
