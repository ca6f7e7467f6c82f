"""The warehouse's storage primitives on the local disk and on the embedded S3
server (SeaweedFS), and what holding an application costs: ``flock`` on a local
warehouse against the lease on S3, including how long after a holder is killed
the next one gets it.

    python -m benchmarks.storage          # writes its section of docs/benchmarks.md
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.report import machine, write_section
from jobs import lease, storage_server
from jobs.local_server import find_free_port
from jobs.settings import REPO_ROOT
from jobs.warehouse import Location

REPEAT = 200
TTL_S = 2.0


def _ms(action: Callable[[int], object], repeat: int = REPEAT) -> float:
    times = []
    for i in range(repeat):
        started = time.perf_counter()
        action(i)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def primitives(root: Location) -> dict[str, float]:
    data = b"x" * 1024
    return {
        "write 1 KB, whole": _ms(lambda i: (root / "w" / f"{i}").write_bytes(data)),
        "create 1 KB if absent": _ms(lambda i: (root / "c" / f"{i}").create(data)),
        "read 1 KB": _ms(lambda i: (root / "w" / f"{i}").read_bytes()),
        "stat": _ms(lambda i: (root / "w" / f"{i}").stat()),
        f"list a folder of {REPEAT}": _ms(lambda i: (root / "w").iterdir(), 20),
    }


def pyarrow_primitives(bucket: str, prefix: str) -> dict[str, float]:
    """The same calls through pyarrow's S3 file system, the other client at hand
    (it has no conditional writes: no create-if-absent)."""
    import pyarrow.fs as pafs

    fs = pafs.S3FileSystem(
        access_key=os.environ["AWS_ACCESS_KEY_ID"],
        secret_key=os.environ["AWS_SECRET_ACCESS_KEY"],
        endpoint_override=os.environ["AWS_ENDPOINT_URL"],
        scheme="http",
        region=os.environ["AWS_REGION"],
    )
    data = b"x" * 1024
    base = f"{bucket}/{prefix}"

    def write(i: int) -> None:
        with fs.open_output_stream(f"{base}/w/{i}") as out:
            out.write(data)

    def read(i: int) -> None:
        with fs.open_input_stream(f"{base}/w/{i}") as handle:
            handle.read()

    return {
        "write 1 KB, whole": _ms(write),
        "read 1 KB": _ms(read),
        "stat": _ms(lambda i: fs.get_file_info(f"{base}/w/{i}")),
        f"list a folder of {REPEAT}": _ms(
            lambda i: fs.get_file_info(pafs.FileSelector(f"{base}/w")), 20
        ),
    }


def _holder_killed_then_taken(take: Callable[[], object], start: list[str], env: dict) -> float:
    """Seconds from SIGKILL of a holder to the next taker's success."""
    proc = subprocess.Popen(start, env=env, stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT)
    assert proc.stdout is not None and proc.stdout.readline().startswith("held")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed = time.monotonic()
    while True:
        try:
            take()
            return time.monotonic() - killed
        except (lease.LeaseError, BlockingIOError):
            time.sleep(0.05)


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="bench-storage-"))
    info = storage_server.start(work / "storage", find_free_port(19400, 19900))
    os.environ.update(info.environment())
    try:
        local = primitives(Location.local_path(work / "local"))
        s3 = primitives(Location.parse(f"{info.warehouse}/bench"))
        via_pyarrow = pyarrow_primitives(info.bucket, "bench-pyarrow")
        app = Location.parse(f"{info.warehouse}/bench-app")
        take_release = _ms(
            lambda i: (
                lease.holding(app / f"l{i}" / lease.LEASE, "b", "b", 30).__enter__().release()
            ),
            50,
        )
        lock_file = work / "local" / "_lock"

        def flock_once(_i: int) -> None:
            with open(lock_file, "a+") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)

        flock_ms = _ms(flock_once)
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        holder = [sys.executable, "-m", "tests.lease_holder"]
        lease_takeover = _holder_killed_then_taken(
            lambda: lease.take(app / "k" / lease.LEASE, "t", "t", TTL_S).release(),
            [*holder, str(app / "k" / lease.LEASE), str(TTL_S), "a"],
            env,
        )
        flock_holder = (
            "import fcntl,sys,time; h=open(sys.argv[1],'a+'); "
            "fcntl.flock(h, fcntl.LOCK_EX); print('held', flush=True); time.sleep(600)"
        )

        def flock_take() -> None:
            with open(lock_file, "a+") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)

        flock_takeover = _holder_killed_then_taken(
            flock_take, [sys.executable, "-c", flock_holder, str(lock_file)], env
        )
    finally:
        storage_server.stop(work / "storage")
        shutil.rmtree(work, ignore_errors=True)
    rows = "\n".join(
        f"| {name} | {local[name]:.2f} | {s3[name]:.2f} | {s3[name] / local[name]:.0f}x | "
        + (f"{via_pyarrow[name]:.2f} |" if name in via_pyarrow else "(none) |")
        for name in local
    )
    write_section(
        f"""## Storage: the warehouse's primitives, local disk against S3

`python -m benchmarks.storage` on {machine()}. The S3 store is the embedded SeaweedFS
(`python -m jobs storage start`) on loopback; medians of {REPEAT} calls, in ms.

| operation | local | S3 (obstore) | ratio | S3 (pyarrow) |
|---|---|---|---|---|
{rows}

`jobs/warehouse.py` reaches S3 with obstore: the only client here with conditional
writes (create-if-absent, replace-if-version), which the lease, the cuts and delta-rs's
commits rely on. On the calls both have it writes and reads faster than pyarrow's S3
file system and is about even on stat and listing.

Holding an application (the lease here lasts {TTL_S:.0f} s; the platform's default is
{lease.DEFAULT_TTL_S:.0f} s):

| | local `flock` | S3 lease |
|---|---|---|
| take and release, median ms | {flock_ms:.2f} | {take_release:.2f} |
| a holder SIGKILLed: the next taker has it after, s | {flock_takeover:.2f} | {lease_takeover:.2f} |

A killed holder's `flock` is released by the kernel at once; a lease is taken over only
after a whole lease time without a renewal, watched on the taker's own clock. So a local
warehouse keeps `flock`, and the lease is what S3 (shared by machines) needs.
"""
    )


if __name__ == "__main__":
    main()
