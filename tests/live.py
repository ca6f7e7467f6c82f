"""A continuous run under a live producer, as the replicated cluster test drives
it: the producer, the stream process, and the ledger read back."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from deltalake import DeltaTable

from jobs import kafka_admin
from jobs.settings import REPO_ROOT
from tests.conftest import jobs_args
from tests.expected import clicks_per_window, state_as_counter


class LiveProducer(threading.Thread):
    """Produces small chunks of clicks (event time = now, so nothing is late) and
    keeps every acknowledged value; ``paused`` holds it while the broker restarts."""

    def __init__(self, config: dict[str, str], topic: str) -> None:
        super().__init__(daemon=True)
        self.config, self.topic = config, topic
        self.values: list[bytes] = []
        self.running = threading.Event()
        self.running.set()
        self.idle = threading.Event()
        self.stopped = threading.Event()
        self.error: BaseException | None = None
        self.rng = random.Random(7)

    def run(self) -> None:
        try:
            while not self.stopped.is_set():
                if not self.running.is_set():
                    self.idle.set()
                    time.sleep(0.05)
                    continue
                self.idle.clear()
                now = int(time.time())
                chunk = [
                    json.dumps(
                        {"user_id": f"u{self.rng.randrange(40)}", "timestamp": now - i % 30}
                    ).encode()
                    if self.rng.random() > 0.01
                    else b"not json"
                    for i in range(self.rng.randrange(50, 300))
                ]
                stamp = int(time.time() * 1000)
                kafka_admin.produce_all(self.config, self.topic, ((None, v, stamp) for v in chunk))
                self.values.extend(chunk)
                time.sleep(0.2)
        except BaseException as exc:  # reported by the test
            self.error = exc
        finally:
            self.idle.set()

    def pause(self) -> None:
        self.running.clear()
        self.idle.clear()
        assert self.idle.wait(60), "the producer did not pause"

    def resume(self) -> None:
        self.running.set()


def jobs_cmd(path: Path, servers: str, warehouse: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "jobs", *jobs_args(path, servers, warehouse, *args)]


def start_stream(path: Path, servers: str, warehouse: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        jobs_cmd(path, servers, warehouse, "run", "--trigger", "continuous", "--quiet"),
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def kill(stream: subprocess.Popen[str]) -> None:
    if stream.poll() is None:
        os.killpg(stream.pid, signal.SIGKILL)
    stream.communicate(timeout=60)


def ledger_batches(warehouse: Path) -> list[dict[str, Any]]:
    path = warehouse / "user_clicks" / "_ledger"
    if not DeltaTable.is_deltatable(str(path)):
        return []
    rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    return sorted(
        (r for r in rows if r["entry_type"] == "batch"), key=lambda r: (r["epoch"], r["batch_id"])
    )


def wait_for_batches(warehouse: Path, more_than: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(ledger_batches(warehouse)) > more_than:
            return
        time.sleep(0.5)
    raise AssertionError(f"no batch committed within {timeout} s")


def assert_ledger_tiles(batches: list[dict[str, Any]], topic: str, highs: dict[int, int]) -> None:
    """The ledger's ranges tile each partition of ``topic``: 0 .. its high watermark,
    no gap, no overlap, each batch once; every record read is aggregated or a dead
    letter."""
    assert len({(b["epoch"], b["batch_id"]) for b in batches}) == len(batches)
    position = dict.fromkeys(highs, 0)
    for batch in batches:
        start = json.loads(batch["start_offsets"]).get(topic, {})
        end = json.loads(batch["end_offsets"])[topic]
        for part in highs:
            begin = int(start.get(str(part), position[part]))
            assert begin == position[part], (batch["epoch"], batch["batch_id"], part)
            assert int(end[str(part)]) >= begin
            position[part] = int(end[str(part)])
        assert batch["records_in"] == batch["aggregated"] + batch["dead_lettered"]
    assert position == highs


def assert_exact_clicks(warehouse: Path, values: list[bytes]) -> None:
    """``user_clicks``'s state equals plain Python's count of ``values`` (none of
    them late), and every record that is no click is a dead letter, once."""
    expected, dead, late = clicks_per_window([list(values)])
    assert late == 0
    root = warehouse / "user_clicks"
    state = DeltaTable(str(root / "state")).to_pyarrow_table().to_pylist()
    assert state_as_counter(state, "clicks") == expected
    letters = DeltaTable(str(root / "dead_letter")).to_pyarrow_table().to_pylist()
    assert len(letters) == dead
    assert len({(r["partition"], r["offset"]) for r in letters}) == dead
