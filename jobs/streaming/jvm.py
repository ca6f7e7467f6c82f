"""JVM start-up: a class-data-sharing (AppCDS) archive of the classes Spark loads.

A cold ``spark-submit`` spends seconds loading and verifying Spark's classes. The
first run dumps the classes it loaded into an archive when its JVM exits; later
runs map it and start about 2 s sooner (measured: session ready in 4.0-4.3 s
instead of 6.1 s on 2 cores). The platform's jars are on the driver's class path
too, so Delta's classes, which a session loads at start, are in the archive
(with them: session 3.6-4.2 s instead of 5.7-5.9 s, the first Delta write 5.6 s
instead of 7.3 s). The archive is keyed by the Java and Spark in use,
written under a per-process name and renamed into place only once complete, so
concurrent runs never read a half-written archive. A stale or foreign archive is
refused by the JVM itself, which then starts without it (``-Xshare:auto``).
``PLATFORM_SPARK_CDS=off`` disables it. ``PLATFORM_SPARK_JAVA_OPTIONS`` adds
options of the user's (``-XX:TieredStopAtLevel=1``, the JIT's first tier only,
made a cold 2,000-record run 23% faster and a cold 1M-event batch 10% slower).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

import psutil
import pyspark

from jobs.settings import REPO_ROOT

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


def _key() -> str:
    java = os.environ.get("JAVA_HOME") or os.path.realpath(shutil.which("java") or "java")
    # The driver's class path is part of an archive's identity: a changed jar set
    # needs a new archive (the JVM would refuse the old one for good).
    from jobs.jars import spark_jars

    # A jar rebuilt in place (make setup) keeps its name: its size and time count too
    # (the JVM refuses an archive whose jars changed, and would start without it).
    jars = "|".join(
        sorted(f"{jar}:{jar.stat().st_size}:{jar.stat().st_mtime_ns}" for jar in spark_jars())
    )
    identity = f"{java}|{pyspark.__version__}|{Path(pyspark.__file__).parent}|{jars}"
    return hashlib.sha256(identity.encode()).hexdigest()[:16]


def archive_dir() -> Path:
    return Path(tempfile.gettempdir()) / "platform-jvm"


def cds_options() -> str:
    """Driver JVM options: map the archive, or dump one at exit if there is none."""
    if os.environ.get(ENV, "").lower() in ("off", "0", "false"):
        return ""
    folder = archive_dir()
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"spark-{_key()}.jsa"
    dumping = False
    for dump in folder.glob(f"spark-{_key()}.*.jsa"):
        pid = int(dump.suffixes[-2].lstrip("."))
        try:
            settled = time.time() - dump.stat().st_mtime > DUMP_SETTLE_S
            if psutil.pid_exists(pid) or not settled:
                dumping = True  # another run is writing one: do not write a second
            elif final.exists() or dump.stat().st_size == 0:
                dump.unlink(missing_ok=True)  # a spare (or an empty) dump
            else:
                dump.replace(final)  # a finished dump of an earlier run
        except FileNotFoundError:
            continue  # another run starting at the same time moved or removed it
    quiet = "-Xshare:auto -Xlog:cds=off,cds+dynamic=off"
    if final.exists():
        return f"{quiet} -XX:SharedArchiveFile={final}"
    if dumping:
        return ""
    prune_other_archives(folder, _key())
    log.info("no class-data-sharing archive yet: this run writes one at exit")
    return f"{quiet} -XX:ArchiveClassesAtExit={folder / f'spark-{_key()}.{os.getpid()}.jsa'}"


def prune_other_archives(folder: Path, key: str) -> None:
    """Delete all but the newest few archives of other keys (a JVM that maps one
    keeps its mapping; a checkout that still uses it writes it again), and other
    keys' spare dumps whose writer is gone (two runs that exit together both dump).
    Runs of the same key may prune at once: a file gone meanwhile is skipped."""
    others: list[tuple[float, Path]] = []
    for path in folder.glob("spark-*.jsa"):
        if path.name.startswith(f"spark-{key}."):
            continue
        try:
            modified = path.stat().st_mtime
        except FileNotFoundError:
            continue
        if path.name.count(".") == 1:
            others.append((modified, path))
            continue
        pid = path.suffixes[-2].lstrip(".")
        settled = time.time() - modified > DUMP_SETTLE_S
        if settled and not (pid.isdigit() and psutil.pid_exists(int(pid))):
            path.unlink(missing_ok=True)
    others.sort(reverse=True)
    for _modified, stale in others[KEEP_OTHER_ARCHIVES:]:
        log.info("removing an old class-data-sharing archive: %s", stale.name)
        stale.unlink(missing_ok=True)


def driver_java_options() -> str:
    """Every driver JVM's options: the platform's log config and the archive."""
    extra = os.environ.get(EXTRA_ENV, "").strip()
    return f"-Dlog4j.configurationFile={LOG4J_CONFIG} {cds_options()} {extra}".strip()
